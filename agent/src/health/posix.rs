//! The pattern dialects LBNL NHC inherits from bash, through glibc itself rather than a
//! re-implementation, so that a pattern that works (or does not) under NHC does the same
//! here:
//!
//! - [`Ere`]: POSIX extended regular expressions, compiled with `regcomp(3)` and
//!   `REG_EXTENDED` as bash's `[[ s =~ re ]]` does (`sh_regmatch` in bash's
//!   `lib/sh/shmatch.c`). `[[:digit:]]`, `\b` and back-references work as in glibc; Perl
//!   classes such as `\d` do not (glibc reads `\d` as `d`).
//! - [`glob_match`]: shell patterns with `fnmatch(3)` and glibc's `FNM_EXTMATCH`, which
//!   is what bash's `[[ s == pattern ]]` accepts (the bash manual, "Conditional
//!   Constructs": the pattern is matched "as if the extglob shell option were enabled"):
//!   `*`, `?`, bracket expressions with POSIX classes (`[[:digit:]]`), `\x`, and
//!   `?(a|b)`, `*(..)`, `+(..)`, `@(..)`, `!(..)`.
//!
//! The agent never calls `setlocale`, so both run in the C locale (bytes, ASCII classes).
//! Written against libc because no maintained crate binds glibc's dialects (the `regex`
//! crate's syntax differs: it accepts `\d` and rejects back-references).
#![allow(unsafe_code)]

use std::ffi::CString;

/// glibc's `FNM_EXTMATCH` (`<fnmatch.h>`: `1 << 5`), which the libc crate does not export.
const FNM_EXTMATCH: libc::c_int = 1 << 5;

/// A compiled POSIX extended regular expression (glibc `regcomp`, `REG_EXTENDED`).
pub struct Ere {
    // Boxed so the compiled pattern never moves after `regcomp` filled it in.
    re: Box<libc::regex_t>,
}

// SAFETY: glibc's `regexec` takes the pattern's internal lock and does not change the
// compiled pattern (it is documented MT-Safe in glibc's manual, "POSIX Regexp Matching");
// `regfree` runs only in `Drop`, with exclusive access.
unsafe impl Send for Ere {}
// SAFETY: as above; `is_match` only calls `regexec`.
unsafe impl Sync for Ere {}

/// A pattern glibc's `regcomp` refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EreError {
    /// The pattern holds a NUL byte (C strings cannot).
    #[error("a NUL byte in a pattern")]
    Nul {
        /// The pattern.
        pattern: String,
    },
    /// `regcomp` failed: its code and glibc's message for it (`regerror`), which is what
    /// is shown.
    #[error("{regerror}")]
    Compile {
        /// The pattern.
        pattern: String,
        /// `regcomp`'s return code (`REG_EPAREN`...).
        code: i32,
        /// glibc's message for the code, e.g. "Unmatched ( or \\(".
        regerror: String,
    },
}

impl Ere {
    /// Compiles `pattern`.
    ///
    /// # Errors
    /// [`EreError::Compile`] with glibc's message (`regerror`), e.g. "Unmatched ( or
    /// \\(", or [`EreError::Nul`].
    pub fn new(pattern: &str) -> Result<Ere, EreError> {
        let c = CString::new(pattern).map_err(|_| EreError::Nul {
            pattern: pattern.to_string(),
        })?;
        // SAFETY: an all-zero regex_t is a valid (empty) value to pass to regcomp, which
        // initialises it.
        let mut re: Box<libc::regex_t> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `re` points to writable memory of the right type, `c` is NUL-terminated.
        let rc =
            unsafe { libc::regcomp(&mut *re, c.as_ptr(), libc::REG_EXTENDED | libc::REG_NOSUB) };
        if rc != 0 {
            let mut buf = [0u8; 256];
            // SAFETY: `buf` is writable for its length; regerror NUL-terminates within it.
            let n = unsafe {
                libc::regerror(rc, &*re, buf.as_mut_ptr().cast(), buf.len() as libc::size_t)
            };
            // glibc: after a failed regcomp nothing needs freeing, but regfree on the
            // zeroed/partial value is allowed and harmless.
            // SAFETY: `re` came from regcomp.
            unsafe { libc::regfree(&mut *re) };
            let len = n.min(buf.len()).saturating_sub(1);
            return Err(EreError::Compile {
                pattern: pattern.to_string(),
                code: rc,
                regerror: String::from_utf8_lossy(&buf[..len]).into_owned(),
            });
        }
        Ok(Ere { re })
    }

    /// Whether the expression matches anywhere in `text` (unanchored, as bash's `=~`).
    /// Text after a NUL byte is not seen (bash strings cannot hold NUL either).
    pub fn is_match(&self, text: &str) -> bool {
        let text = text.split('\0').next().unwrap_or("");
        let Ok(c) = CString::new(text) else {
            return false;
        };
        // SAFETY: `re` was compiled by regcomp; with REG_NOSUB, nmatch 0 and a null pmatch
        // are allowed.
        let rc = unsafe { libc::regexec(&*self.re, c.as_ptr(), 0, std::ptr::null_mut(), 0) };
        rc == 0
    }
}

impl std::fmt::Debug for Ere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ere")
    }
}

impl Drop for Ere {
    fn drop(&mut self) {
        // SAFETY: `re` was compiled by regcomp and is freed once.
        unsafe { libc::regfree(&mut *self.re) };
    }
}

/// Whether the shell pattern matches the whole of `text`, as bash's `[[ text == pattern ]]`
/// (glibc `fnmatch` with `FNM_EXTMATCH`; `*` matches `/` and a leading `.`). A NUL byte in
/// either never matches.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (Ok(p), Ok(t)) = (CString::new(pattern), CString::new(text)) else {
        return false;
    };
    // SAFETY: both are NUL-terminated strings that live across the call.
    unsafe { libc::fnmatch(p.as_ptr(), t.as_ptr(), FNM_EXTMATCH) == 0 }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ere_is_glibc_extended() {
        let re = |p: &str| Ere::new(p).unwrap();
        assert!(re("^n[[:digit:]]+$").is_match("n12"));
        assert!(!re("^n\\d+$").is_match("n12"));
        assert!(re("^n\\d+$").is_match("ndd"));
        assert!(re("(a|b)\\1").is_match("xaay"));
        assert!(re("\\bx").is_match("a x"));
        assert!(Ere::new("(unclosed").unwrap_err().to_string().contains("("));
        assert!(Ere::new("a\0b").is_err());
    }

    #[test]
    fn globs_are_bash_extglob() {
        assert!(glob_match("n[[:digit:]]*", "n1x"));
        assert!(!glob_match("n[[:digit:]]*", "nx1"));
        assert!(glob_match("+(gpu|cpu)*", "gpucpu7"));
        assert!(!glob_match("+(gpu|cpu)*", "login1"));
        assert!(glob_match("!(login*)", "n1"));
        assert!(!glob_match("!(login*)", "login1"));
        assert!(glob_match("*", "/a/.b"));
        assert!(glob_match("a\\*b", "a*b"));
        assert!(!glob_match("a\\*b", "axb"));
    }
}
