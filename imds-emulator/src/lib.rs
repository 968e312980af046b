//! IMDS emulator library.
