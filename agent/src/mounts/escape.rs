//! systemd's path escaping, as `systemd-escape --path` does it (systemd.unit(5) "String
//! Escaping for Inclusion in Unit Names", `unit_name_path_escape()` in systemd's
//! `src/basic/unit-name.c`): a mount unit must be named after its mount point this way or
//! systemd refuses to load it.

/// Escapes a normalized absolute path: leading and trailing `/` removed, the root becomes
/// `-`, every other `/` becomes `-`, bytes other than ASCII letters, digits, `:`, `_` and
/// `.` (and a `.` at the very start) become `\xNN` (lower-case hex).
pub fn escape_path(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return "-".to_string();
    }
    let mut out = String::with_capacity(trimmed.len() * 2);
    for (i, b) in trimmed.bytes().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if i == 0 => out.push_str("\\x2e"),
            b if b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.') => {
                out.push(char::from(b))
            }
            b => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out
}

/// The `.mount` unit name for a mount point, as `systemd-escape --path --suffix=mount`.
pub fn mount_unit_name(mount_point: &str) -> String {
    format!("{}.mount", escape_path(mount_point))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expected values are `systemd-escape --path --suffix=mount` output from systemd 252
    /// (the integration test `escaping_matches_systemd_escape` runs the real tool too).
    #[test]
    fn matches_systemd_escape() {
        for (path, unit) in [
            ("/mnt/fsx", "mnt-fsx.mount"),
            ("/mnt/my fs", "mnt-my\\x20fs.mount"),
            ("/mnt/ümlaut", "mnt-\\xc3\\xbcmlaut.mount"),
            ("/.hidden/x", "\\x2ehidden-x.mount"),
            ("/mnt/a:b_c.d", "mnt-a:b_c.d.mount"),
            ("/mnt/a\\b", "mnt-a\\x5cb.mount"),
            ("/mnt/fsx-01", "mnt-fsx\\x2d01.mount"),
            ("/mnt/a%b", "mnt-a\\x25b.mount"),
            ("/mnt/.x", "mnt-.x.mount"),
            ("/", "-.mount"),
            ("/mnt/a@b+c", "mnt-a\\x40b\\x2bc.mount"),
        ] {
            assert_eq!(mount_unit_name(path), unit, "{path}");
        }
    }
}
