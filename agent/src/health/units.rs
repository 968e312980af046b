//! Sizes, counts and thresholds as LBNL NHC writes them (`nhc_common_parse_size` and
//! `nhc_common_parse_count` in NHC's `scripts/common.nhc`).
//!
//! - A size is in KiB: a plain number or `k` is KiB, `M` is 1024 KiB, `G` 1024² KiB, and
//!   so on for `T`, `P`, `E`, with an optional trailing `b`/`B`: `0b`, `512M`, `1gb`,
//!   `1tb`, `5G`.
//! - A count (inodes) is a plain number with decimal suffixes: `100k` = 100 000, `2M`.
//! - A threshold is a percentage (`10%`) or a size / count.
//!
//! Decimals are accepted (`1.5G`), which NHC does not; the result is rounded down.

use std::fmt;

/// A size, count or percentage that cannot be read; each variant holds the value as
/// written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    /// Not a number of KiB with an optional `k`, `M`, `G`, `T`, `P` or `E` (and `b`).
    #[error("invalid size {value:?}: expected a number of KiB with an optional suffix k, M, G, T, P or E (and b), e.g. 512M or 1gb")]
    NotASize {
        /// The value as written.
        value: String,
    },
    /// Not a number with an optional `k`, `M`, `G`, `T` (powers of 1000).
    #[error("invalid count {value:?}: expected a number with an optional suffix k, M, G, T (powers of 1000), e.g. 100k")]
    NotACount {
        /// The value as written.
        value: String,
    },
    /// `N%` outside 0 to 100, or not a number.
    #[error("invalid percentage {value:?}: expected 0% to 100%")]
    NotAPercentage {
        /// The value as written (with its `%`).
        value: String,
    },
}

/// A threshold: a percentage or an absolute amount (KiB for space, a number for inodes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Threshold {
    /// `N%`, 0 to 100.
    Percent(f64),
    /// An absolute amount.
    Absolute(u64),
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Threshold::Percent(p) => write!(f, "{p}%"),
            Threshold::Absolute(n) => write!(f, "{n}"),
        }
    }
}

fn split_number(s: &str) -> Option<(f64, &str)> {
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, rest) = s.split_at(end);
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') {
        return None;
    }
    num.parse::<f64>().ok().map(|n| (n, rest))
}

/// Parses a size into KiB: `1024`, `512M`, `1gb`, `0b`, `5G`, `1tb`.
///
/// # Errors
/// [`UnitsError::NotASize`].
pub fn parse_size_kib(s: &str) -> Result<u64, UnitsError> {
    let bad = || {
        Err(UnitsError::NotASize {
            value: s.to_string(),
        })
    };
    let Some((n, unit)) = split_number(s.trim()) else {
        return bad();
    };
    let unit = unit
        .strip_suffix(['b', 'B'])
        .unwrap_or(unit)
        .to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "k" => 1.0,
        "m" => 1024.0,
        "g" => 1024.0 * 1024.0,
        "t" => 1024.0f64.powi(3),
        "p" => 1024.0f64.powi(4),
        "e" => 1024.0f64.powi(5),
        _ => return bad(),
    };
    Ok((n * mult) as u64)
}

/// Parses a count: `1000`, `100k`, `2M`, `1G` (powers of 1000).
///
/// # Errors
/// [`UnitsError::NotACount`].
pub fn parse_count(s: &str) -> Result<u64, UnitsError> {
    let bad = || {
        Err(UnitsError::NotACount {
            value: s.to_string(),
        })
    };
    let Some((n, unit)) = split_number(s.trim()) else {
        return bad();
    };
    let mult: f64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1.0,
        "k" => 1e3,
        "m" => 1e6,
        "g" => 1e9,
        "t" => 1e12,
        "p" => 1e15,
        "e" => 1e18,
        _ => return bad(),
    };
    Ok((n * mult) as u64)
}

fn parse_percent(s: &str) -> Option<Result<f64, UnitsError>> {
    let p = s.trim().strip_suffix('%')?;
    Some(match p.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(UnitsError::NotAPercentage {
            value: s.to_string(),
        }),
    })
}

/// A space threshold: `10%` or a size (KiB).
///
/// # Errors
/// [`UnitsError`]: the value is not a percentage of 0 to 100 nor a size / count.
pub fn parse_space_threshold(s: &str) -> Result<Threshold, UnitsError> {
    match parse_percent(s) {
        Some(p) => p.map(Threshold::Percent),
        None => parse_size_kib(s).map(Threshold::Absolute),
    }
}

/// An inode threshold: `10%` or a count.
///
/// # Errors
/// [`UnitsError`]: the value is not a percentage of 0 to 100 nor a size / count.
pub fn parse_count_threshold(s: &str) -> Result<Threshold, UnitsError> {
    match parse_percent(s) {
        Some(p) => p.map(Threshold::Percent),
        None => parse_count(s).map(Threshold::Absolute),
    }
}

/// Formats KiB for messages: `1.5 GiB`, `512 MiB`, `12 KiB`.
pub fn human_kib(kib: u64) -> String {
    let units = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = kib as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", units[i])
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// Percentage used the way df(1) rounds it: up, `used / (used + available)`.
pub fn df_percent(used: u64, avail: u64) -> u64 {
    let total = used + avail;
    if total == 0 {
        0
    } else {
        (used * 100).div_ceil(total)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_are_kib() {
        assert_eq!(parse_size_kib("1024").unwrap(), 1024);
        assert_eq!(parse_size_kib("0b").unwrap(), 0);
        assert_eq!(parse_size_kib("1k").unwrap(), 1);
        assert_eq!(parse_size_kib("1mb").unwrap(), 1024);
        assert_eq!(parse_size_kib("5G").unwrap(), 5 * 1024 * 1024);
        assert_eq!(parse_size_kib("1gb").unwrap(), 1024 * 1024);
        assert_eq!(parse_size_kib("1tb").unwrap(), 1024 * 1024 * 1024);
        assert_eq!(parse_size_kib("2TB").unwrap(), 2 * 1024 * 1024 * 1024);
        assert_eq!(parse_size_kib("1.5G").unwrap(), 1024 * 1024 * 3 / 2);
        for bad in ["", "G", "1x", "1gib", "-1", "1..5G", ".5G", "1 2"] {
            assert!(parse_size_kib(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn counts_are_decimal() {
        assert_eq!(parse_count("100k").unwrap(), 100_000);
        assert_eq!(parse_count("1k").unwrap(), 1000);
        assert_eq!(parse_count("2M").unwrap(), 2_000_000);
        assert_eq!(parse_count("17").unwrap(), 17);
        assert!(parse_count("10kb").is_err());
        assert!(parse_count("x").is_err());
    }

    #[test]
    fn thresholds() {
        assert_eq!(
            parse_space_threshold("10%").unwrap(),
            Threshold::Percent(10.0)
        );
        assert_eq!(
            parse_space_threshold("5G").unwrap(),
            Threshold::Absolute(5 << 20)
        );
        assert_eq!(
            parse_count_threshold("100k").unwrap(),
            Threshold::Absolute(100_000)
        );
        assert_eq!(
            parse_count_threshold("1%").unwrap(),
            Threshold::Percent(1.0)
        );
        assert!(parse_space_threshold("101%").is_err());
        assert!(parse_space_threshold("x%").is_err());
    }

    #[test]
    fn df_rounding_and_human() {
        assert_eq!(df_percent(1, 99), 1);
        assert_eq!(df_percent(1, 199), 1);
        assert_eq!(df_percent(0, 0), 0);
        assert_eq!(df_percent(50, 50), 50);
        assert_eq!(human_kib(1024 * 1024), "1 GiB");
        assert_eq!(human_kib(1536), "1.5 MiB");
    }
}
