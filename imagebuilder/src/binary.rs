//! What a program put into an image needs to run there: the architecture it was built for
//! and the newest glibc symbol version it links against (its glibc floor), read from its
//! ELF headers with the `object` crate (the ELF format: the System V ABI and its
//! `.gnu.version_r` extension, "Symbol Versioning" in the Linux Standard Base).
//!
//! The image builder refuses an agent binary that cannot start on the image it would bake
//! (issue 42 §3): built for another architecture than `--arch`, or needing a glibc newer
//! than the chosen OS has (Amazon Linux 2023 and RHEL 9 have 2.34: a binary built against
//! a newer glibc fails there at start with "version `GLIBC_2.39' not found").

use std::fmt;
use std::path::Path;

use object::elf::{self, FileHeader64};
use object::read::elf::{ElfFile64, FileHeader};
use object::{Architecture, Endianness, Object, ReadCache};

use crate::error::{Error, Result};

/// A glibc version, `major.minor` (`GLIBC_2.34` is `2.34`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GlibcVersion {
    /// Major version (2).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl GlibcVersion {
    /// Parses `2.34` (or `2.2.5`, as on x86_64: the third part is ignored); `None` unless
    /// two or three dot-separated numbers.
    pub fn parse(s: &str) -> Option<GlibcVersion> {
        let mut parts = s.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        match (parts.next(), parts.next()) {
            (None, _) => {}
            (Some(p), None) if p.parse::<u32>().is_ok() => {}
            _ => return None,
        }
        Some(GlibcVersion { major, minor })
    }
}

impl fmt::Display for GlibcVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// What a binary needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Needs {
    /// The architecture in the image builder's words (`--arch`): `x86_64` or `arm64`;
    /// another machine's name as `object` gives it (`Riscv64`...).
    pub arch: String,
    /// The newest `GLIBC_x.y` version of the symbols it imports from the C library
    /// (`libc.so.6`, `libm.so.6`...); `None` for a static binary or one without glibc.
    pub glibc: Option<GlibcVersion>,
}

/// Reads what the 64-bit ELF program at `path` needs.
///
/// # Errors
/// [`Error::BadInput`] naming the file: it cannot be read, or is not a 64-bit ELF file
/// with well-formed version sections.
pub fn needs(path: &Path) -> Result<Needs> {
    let bad = |what: String| Error::BadInput(format!("{}: {what}", path.display()));
    let not_elf = |e: object::Error| bad(format!("not a 64-bit ELF program: {e}"));
    // Read as needed, not whole: the ELF header, the section headers and the version
    // sections are a few KiB of an agent build of about 100 MB.
    let file = std::fs::File::open(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let cache = ReadCache::new(file);
    let data = &cache;
    let header = FileHeader64::<Endianness>::parse(data).map_err(not_elf)?;
    let endian = header.endian().map_err(not_elf)?;
    let arch = match header.e_machine(endian) {
        elf::EM_X86_64 => "x86_64".to_string(),
        elf::EM_AARCH64 => "arm64".to_string(),
        machine => {
            // Another machine, named as `object` names it (its symbol tables read too).
            let other = ElfFile64::<Endianness, _>::parse(data)
                .map_or(Architecture::Unknown, |f| f.architecture());
            format!("{other:?} (ELF machine {machine})")
        }
    };
    let sections = header.sections(endian, data).map_err(not_elf)?;
    let mut glibc: Option<GlibcVersion> = None;
    let malformed = |e: object::Error| bad(format!("its .gnu.version_r section: {e}"));
    if let Some((mut needed, link)) = sections.gnu_verneed(endian, data).map_err(malformed)? {
        let strings = sections.strings(endian, data, link).map_err(malformed)?;
        while let Some((_, mut versions)) = needed.next().map_err(malformed)? {
            while let Some(aux) = versions.next().map_err(malformed)? {
                let name = aux.name(endian, strings).map_err(malformed)?;
                let v = std::str::from_utf8(name)
                    .ok()
                    .and_then(|n| n.strip_prefix("GLIBC_"))
                    .and_then(GlibcVersion::parse);
                if let Some(v) = v {
                    glibc = glibc.max(Some(v));
                }
            }
        }
    }
    Ok(Needs { arch, glibc })
}

/// Checks that the program at `path` (`what` names it: `--agent-bin <path>`) runs on an
/// image of `arch` whose C library is glibc `os_glibc` (`os` names the OS).
///
/// # Errors
/// [`Error::BadInput`] naming the file, what it needs and what the image has; or as
/// [`needs`].
pub fn check_fits(
    path: &Path,
    what: &str,
    arch: &str,
    os: &str,
    os_glibc: Option<GlibcVersion>,
) -> Result<Needs> {
    let n = needs(path)?;
    if n.arch != arch {
        return Err(Error::BadInput(format!(
            "{what}: built for {}, but the image is {arch} (--arch): build the agent for \
             {} (docs/support-matrix.md)",
            n.arch,
            if arch == "arm64" {
                "aarch64-unknown-linux-gnu"
            } else {
                "x86_64-unknown-linux-gnu"
            }
        )));
    }
    if let (Some(need), Some(has)) = (n.glibc, os_glibc) {
        if need > has {
            return Err(Error::BadInput(format!(
                "{what}: needs glibc {need} (its newest symbol version, GLIBC_{need}), but \
                 {os} has glibc {has}: it would not start there; build it against glibc \
                 {has} or older (docs/support-matrix.md)"
            )));
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn versions_parse_and_order_numerically() {
        let v = |s| GlibcVersion::parse(s).unwrap();
        assert_eq!(
            v("2.34"),
            GlibcVersion {
                major: 2,
                minor: 34
            }
        );
        assert_eq!(v("2.2.5"), GlibcVersion { major: 2, minor: 2 });
        assert!(v("2.9") < v("2.34"));
        assert!(v("2.34") < v("2.39"));
        assert_eq!(v("2.39").to_string(), "2.39");
        for bad in ["", "2", "2.x", "2.3.4.5", "PRIVATE"] {
            assert_eq!(GlibcVersion::parse(bad), None, "{bad}");
        }
    }

    /// This test's own executable: an x86_64 or arm64 program linked against glibc.
    fn me() -> std::path::PathBuf {
        std::env::current_exe().unwrap()
    }

    fn host_arch() -> &'static str {
        match std::env::consts::ARCH {
            "aarch64" => "arm64",
            a => a,
        }
    }

    #[test]
    fn a_program_of_this_host_reads_as_its_architecture_with_a_glibc_floor() {
        let n = needs(&me()).unwrap();
        assert_eq!(n.arch, host_arch());
        let floor = n.glibc.expect("a glibc program imports versioned symbols");
        assert_eq!(floor.major, 2);
        // Rust's standard library needs at least glibc 2.17 on every target.
        assert!(floor >= GlibcVersion::parse("2.17").unwrap(), "{floor}");
    }

    #[test]
    fn another_architecture_is_refused_by_name() {
        let other = if host_arch() == "arm64" {
            "x86_64"
        } else {
            "arm64"
        };
        let e = check_fits(&me(), "--agent-bin x", other, "al2023", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--agent-bin x: built for ") && e.contains(&format!("the image is {other}")),
            "{e}"
        );
    }

    #[test]
    fn a_glibc_floor_above_the_os_is_refused_naming_both() {
        let n = needs(&me()).unwrap();
        let floor = n.glibc.unwrap();
        let older = GlibcVersion {
            major: floor.major,
            minor: floor.minor - 1,
        };
        let e = check_fits(&me(), "--agent-bin x", host_arch(), "old-os", Some(older))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("needs glibc {floor}"))
                && e.contains(&format!("old-os has glibc {older}")),
            "{e}"
        );
        // At or above the floor: accepted.
        assert_eq!(
            check_fits(&me(), "--agent-bin x", host_arch(), "os", Some(floor)).unwrap(),
            n
        );
    }

    /// A copy of this test's executable with its ELF header's `e_machine` set to `machine`.
    fn as_machine(dir: &Path, machine: elf::Machine) -> std::path::PathBuf {
        let mut bytes = std::fs::read(me()).unwrap();
        // e_machine: 2 bytes at offset 18, in the file's byte order (little-endian here).
        assert_eq!(bytes[5], elf::ELFDATA2LSB.0);
        bytes[18..20].copy_from_slice(&machine.0.to_le_bytes());
        let p = dir.join(format!("machine-{machine}"));
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn the_machine_field_names_the_architecture() {
        let dir = tempfile::tempdir().unwrap();
        let arch = |m| needs(&as_machine(dir.path(), m)).unwrap().arch;
        assert_eq!(arch(elf::EM_X86_64), "x86_64");
        assert_eq!(arch(elf::EM_AARCH64), "arm64");
        // Another machine: object's name and the number, refused for either arch.
        assert_eq!(arch(elf::EM_RISCV), "Riscv64 (ELF machine 243)");
        let riscv = as_machine(dir.path(), elf::EM_RISCV);
        for image in ["x86_64", "arm64"] {
            let e = check_fits(&riscv, "--agent-bin x", image, "al2023", None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("--agent-bin x: built for Riscv64"), "{e}");
        }
    }

    #[test]
    fn a_file_that_is_no_elf_program_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agent");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        let e = needs(&p).unwrap_err().to_string();
        assert!(
            e.contains(&p.display().to_string()) && e.contains("not a 64-bit ELF"),
            "{e}"
        );
    }
}
