//! Time as the agent keeps it: Unix seconds (UTC), [`now`], and the text forms it reads
//! and writes.
//!
//! [`parse`] reads the two formats IMDS uses for notices (and Slurm's `SlurmdStartTime`
//! with a `Z` added), [`format()`] writes the first:
//! - RFC 3339, as in `spot/instance-action` (`"time": "2017-09-18T08:22:00Z"`) and
//!   `events/recommendations/rebalance` (`"noticeTime": "2020-10-27T08:22:00Z"`); fractional
//!   seconds and a numeric offset (`+00:00`) are accepted.
//! - `21 Jan 2019 09:00:43 GMT`, as in `events/maintenance/scheduled` (`NotBefore`,
//!   `NotAfter`); a leading weekday (`Mon, `) and `UTC` for `GMT` are accepted.
//!
//! Formats: <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html>,
//! <https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instances-status-check_sched.html>.
//!
//! Floor 0 (ground): uses no other module of the crate.

use std::time::{SystemTime, UNIX_EPOCH};

/// A time that is in neither format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid time {value:?}: expected 2017-09-18T08:22:00Z or 21 Jan 2019 09:00:43 GMT")]
pub struct TimeError {
    /// The text given.
    pub value: String,
}

/// Now, in Unix seconds.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Parses either format into Unix seconds.
///
/// # Errors
/// [`TimeError`] holding the text.
pub fn parse(s: &str) -> Result<i64, TimeError> {
    let t = s.trim();
    let err = || TimeError {
        value: s.to_string(),
    };
    if t.as_bytes().get(4) == Some(&b'-') {
        parse_rfc3339(t).ok_or_else(err)
    } else {
        parse_imds_gmt(t).ok_or_else(err)
    }
}

/// Formats Unix seconds as `2017-09-18T08:22:00Z`.
pub fn format(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn num(s: &str) -> Option<i64> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

fn parse_rfc3339(t: &str) -> Option<i64> {
    let (date, rest) = t.split_once(['T', 't', ' '])?;
    let mut d = date.split('-');
    let (y, mo, da) = (num(d.next()?)?, num(d.next()?)?, num(d.next()?)?);
    if d.next().is_some() {
        return None;
    }
    // Offset: Z, or +HH:MM / -HH:MM.
    let (clock, offset) = if let Some(c) = rest.strip_suffix(['Z', 'z']) {
        (c, 0)
    } else {
        let i = rest.rfind(['+', '-'])?;
        let (c, off) = rest.split_at(i);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off[1..].split_once(':')?;
        let (oh, om) = (num(oh)?, num(om)?);
        if oh > 23 || om > 59 {
            return None;
        }
        (c, sign * (oh * 3600 + om * 60))
    };
    let clock = match clock.split_once('.') {
        Some((c, frac)) if num(frac).is_some() => c,
        Some(_) => return None,
        None => clock,
    };
    let secs = clock_secs(clock)?;
    Some(days_from_civil(y, mo, da)? * 86_400 + secs - offset)
}

fn clock_secs(clock: &str) -> Option<i64> {
    let mut c = clock.split(':');
    let (h, mi, s) = (num(c.next()?)?, num(c.next()?)?, num(c.next()?)?);
    if c.next().is_some() || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    Some(h * 3600 + mi * 60 + s)
}

fn parse_imds_gmt(t: &str) -> Option<i64> {
    // Optional "Mon, " weekday.
    let t = match t.split_once(", ") {
        Some((wd, rest)) if wd.len() == 3 && wd.chars().all(|c| c.is_ascii_alphabetic()) => rest,
        _ => t,
    };
    let parts: Vec<&str> = t.split_whitespace().collect();
    let [day, month, year, clock, zone] = parts.as_slice() else {
        return None;
    };
    if !matches!(*zone, "GMT" | "UTC" | "Z") {
        return None;
    }
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let m = MONTHS
        .iter()
        .position(|m| month.len() >= 3 && month[..3].eq_ignore_ascii_case(m))?;
    let m = i64::try_from(m).ok()? + 1;
    Some(days_from_civil(num(year)?, m, num(day)?)? * 86_400 + clock_secs(clock)?)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm), `None`
/// for an impossible date.
fn days_from_civil(y: i64, m: i64, d: i64) -> Option<i64> {
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&m) || !(1970..=9999).contains(&y) {
        return None;
    }
    let idx = usize::try_from(m - 1).ok()?;
    if d < 1 || d > month_days[idx] {
        return None;
    }
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn both_formats_agree() {
        assert_eq!(parse("2017-09-18T08:22:00Z").unwrap(), 1_505_722_920);
        assert_eq!(parse("18 Sep 2017 08:22:00 GMT").unwrap(), 1_505_722_920);
        assert_eq!(
            parse("Mon, 18 Sep 2017 08:22:00 GMT").unwrap(),
            1_505_722_920
        );
        assert_eq!(parse("2017-09-18T10:22:00+02:00").unwrap(), 1_505_722_920);
        assert_eq!(parse("2017-09-18T08:22:00.123Z").unwrap(), 1_505_722_920);
        assert_eq!(parse("21 Jan 2019 09:00:43 GMT").unwrap(), 1_548_061_243);
        assert_eq!(parse("1 Mar 2024 00:00:00 GMT").unwrap(), 1_709_251_200);
        assert_eq!(parse("29 Feb 2024 23:59:59 UTC").unwrap(), 1_709_251_199);
    }

    #[test]
    fn formats_back() {
        assert_eq!(format(1_505_722_920), "2017-09-18T08:22:00Z");
        assert_eq!(format(1_548_061_243), "2019-01-21T09:00:43Z");
        for t in [0, 951_782_400, 1_709_251_199, 4_102_444_800] {
            assert_eq!(parse(&format(t)).unwrap(), t);
        }
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            " ",
            "2017-09-18",
            "2017-09-18T08:22:00",
            "2017-13-18T08:22:00Z",
            "2017-02-30T08:22:00Z",
            "2017-09-18T25:22:00Z",
            "2017-09-18T08:22Z",
            "21 Jan 2019 09:00:43",
            "21 Foo 2019 09:00:43 GMT",
            "32 Jan 2019 09:00:43 GMT",
            "21 Jan 2019 09:00:43 CET",
            "21 Jan 2019 9h GMT",
            "yesterday",
            "-1 Jan 2019 09:00:43 GMT",
            "2017-09-18T08:22:00.xZ",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse("x").unwrap_err().to_string().contains("\"x\""));
    }
}
