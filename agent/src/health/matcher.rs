//! LBNL NHC's match expressions (`mcheck` in NHC's `scripts/common.nhc`), used for
//! nhc.conf targets and for check arguments (mount sources, options, process names,
//! file contents, command output).
//!
//! - `/regex/`: an unanchored POSIX extended regular expression, as bash's `=~` reads it
//!   (glibc `regcomp` with `REG_EXTENDED`, see [`super::posix::Ere`]: `[[:space:]]`,
//!   `\b` and back-references; no `\d`);
//! - `{n[1-16],login1}`: a node list as NHC's `mcheck_range` reads it: a range matches
//!   numbers written with exactly the width of the longer bound (`{n[1-16]}` matches `n01`
//!   and `n16`, not `n1`); reversed bounds are swapped. Beyond NHC (which fails the whole
//!   list on these), `n[1-3,7]` lists inside brackets and names without a digit are
//!   accepted;
//! - anything else: a shell pattern over the whole string as bash's `[[ s == p ]]` reads
//!   it, extglob included (`n[[:digit:]]*`, `+(gpu|cpu)*`; see [`super::posix::glob_match`]);
//! - a leading `!` negates any of the above.

use std::fmt;
use std::sync::Arc;

use super::posix::{Ere, EreError};

/// A compiled match expression.
#[derive(Clone)]
pub struct Matcher {
    negate: bool,
    kind: Kind,
    source: String,
}

#[derive(Clone)]
enum Kind {
    Glob(String),
    Regex(Arc<Ere>),
    Hosts(Vec<HostPattern>),
    /// One item of a comma-separated list (mount options).
    ListItem(String),
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Matcher({:?})", self.source)
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

/// An NHC match expression that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatcherError {
    /// `/re/` that glibc does not compile.
    #[error("invalid regular expression /{regex}/: {source}")]
    Regex {
        /// The expression between the slashes.
        regex: String,
        /// glibc's refusal.
        #[source]
        source: EreError,
    },
    /// A `{...}` node list element that is empty.
    #[error("invalid node list element {element:?}: empty")]
    EmptyElement {
        /// The element (after trimming).
        element: String,
    },
    /// A node list element with characters a node name cannot have.
    #[error("invalid node list element {element:?}: not a node name")]
    NotANodeName {
        /// The element.
        element: String,
    },
    /// A node list element with `[` and no `]`.
    #[error("invalid node list element {element:?}: unclosed '['")]
    UnclosedRange {
        /// The element.
        element: String,
    },
    /// A node list element with more than one `[range]`, or text around it that is not
    /// a name.
    #[error("invalid node list element {element:?}: only one [range] per element, between a name prefix and suffix")]
    OneRange {
        /// The element.
        element: String,
    },
    /// A `[range]` whose bounds are not numbers.
    #[error("invalid node list element {element:?}: ranges are numbers: [1-4,7] or [01-16]")]
    RangeNotNumbers {
        /// The element.
        element: String,
    },
}

impl Matcher {
    /// Parses an expression.
    ///
    /// # Errors
    /// [`MatcherError`]: an invalid regular expression or node list element.
    pub fn parse(expr: &str) -> Result<Matcher, MatcherError> {
        let (negate, body) = match expr.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, expr),
        };
        let kind = if body.len() >= 2 && body.starts_with('/') && body.ends_with('/') {
            let re = &body[1..body.len() - 1];
            Kind::Regex(Arc::new(Ere::new(re).map_err(|source| {
                MatcherError::Regex {
                    regex: re.to_string(),
                    source,
                }
            })?))
        } else if body.len() >= 2 && body.starts_with('{') && body.ends_with('}') {
            Kind::Hosts(parse_hostlist(&body[1..body.len() - 1])?)
        } else {
            Kind::Glob(body.to_string())
        };
        Ok(Matcher {
            negate,
            kind,
            source: expr.to_string(),
        })
    }

    /// A glob that matches exactly this literal text (glob characters escaped).
    pub fn literal(text: &str) -> Matcher {
        let mut g = String::with_capacity(text.len());
        for c in text.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                g.push('\\');
            }
            g.push(c);
        }
        Matcher {
            negate: false,
            kind: Kind::Glob(g),
            source: text.to_string(),
        }
    }

    /// Holds when `option` is one of the comma-separated items of a mount options string
    /// (`rw`, `noatime`...); shown as the regular expression NHC uses for it.
    pub fn mount_option(option: &str) -> Matcher {
        Matcher {
            negate: false,
            kind: Kind::ListItem(option.to_string()),
            source: format!("/(^|,){option}($|,)/"),
        }
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the expression starts with `!`.
    pub fn is_negated(&self) -> bool {
        self.negate
    }

    /// Whether `text` matches (after negation).
    pub fn matches(&self, text: &str) -> bool {
        let m = match &self.kind {
            Kind::Glob(g) => glob_match(g, text),
            Kind::Regex(r) => r.is_match(text),
            Kind::Hosts(h) => h.iter().any(|p| p.matches(text)),
            Kind::ListItem(item) => text.split(',').any(|o| o == item),
        };
        m != self.negate
    }

    /// Whether the positive part matches, ignoring a leading `!` (for NHC's
    /// file-contents and command-output checks, which treat `!expr` as "no line matches").
    pub fn matches_ignoring_negation(&self, text: &str) -> bool {
        self.matches(text) != self.negate
    }
}

/// Shell pattern over the whole string, as bash's `[[ text == pattern ]]` (extglob on).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    super::posix::glob_match(pattern, text)
}

/// One element of a hostlist: a name, or a prefix, numeric ranges and a suffix.
#[derive(Debug, Clone, PartialEq)]
struct HostPattern {
    prefix: String,
    ranges: Vec<(u64, u64, usize)>,
    suffix: String,
    literal: bool,
}

impl HostPattern {
    fn matches(&self, name: &str) -> bool {
        if self.literal {
            return name == self.prefix;
        }
        let Some(rest) = name.strip_prefix(self.prefix.as_str()) else {
            return false;
        };
        let Some(digits) = rest.strip_suffix(self.suffix.as_str()) else {
            return false;
        };
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            return false;
        }
        let Ok(n) = digits.parse::<u64>() else {
            return false;
        };
        // NHC: the number has exactly the width of the longer bound.
        self.ranges
            .iter()
            .any(|&(lo, hi, width)| digits.len() == width && lo <= n && n <= hi)
    }
}

/// Splits at commas that are not inside brackets.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_hostlist(list: &str) -> Result<Vec<HostPattern>, MatcherError> {
    let bad = |g: &str, why: fn(String) -> MatcherError| Err(why(g.to_string()));
    let name_ok = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let mut out = Vec::new();
    for group in split_top_level(list) {
        let group = group.trim();
        if group.is_empty() {
            return bad(group, |element| MatcherError::EmptyElement { element });
        }
        let Some(open) = group.find('[') else {
            if !name_ok(group) {
                return bad(group, |element| MatcherError::NotANodeName { element });
            }
            out.push(HostPattern {
                prefix: group.to_string(),
                ranges: Vec::new(),
                suffix: String::new(),
                literal: true,
            });
            continue;
        };
        let Some(close) = group.find(']') else {
            return bad(group, |element| MatcherError::UnclosedRange { element });
        };
        let (prefix, inner, suffix) =
            (&group[..open], &group[open + 1..close], &group[close + 1..]);
        if !name_ok(prefix) || !name_ok(suffix) || suffix.contains('[') {
            return bad(group, |element| MatcherError::OneRange { element });
        }
        let mut ranges = Vec::new();
        for r in inner.split(',') {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            let num = |x: &str| {
                if x.is_empty() || !x.chars().all(|c| c.is_ascii_digit()) {
                    None
                } else {
                    x.parse::<u64>().ok()
                }
            };
            let (Some(lo), Some(hi)) = (num(a), num(b)) else {
                return bad(group, |element| MatcherError::RangeNotNumbers { element });
            };
            let width = a.len().max(b.len());
            ranges.push((lo.min(hi), lo.max(hi), width));
        }
        out.push(HostPattern {
            prefix: prefix.to_string(),
            ranges,
            suffix: suffix.to_string(),
            literal: false,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn m(e: &str, s: &str) -> bool {
        Matcher::parse(e).unwrap().matches(s)
    }

    #[test]
    fn globs_match_the_whole_string() {
        assert!(m("*", "anything"));
        assert!(m("node*", "node12"));
        assert!(!m("node*", "gpu-node12"));
        assert!(m("*munged", "/usr/sbin/munged"));
        assert!(m("n?[0-9]", "nx7"));
        assert!(!m("n?[0-9]", "nx"));
        assert!(m("ID=debian", "ID=debian"));
        assert!(!m("ID=debian", "ID=debian-like"));
        assert!(m("[!a]b", "xb"));
        assert!(m("a\\*b", "a*b"));
        assert!(!m("a\\*b", "axb"));
        assert!(m("!login*", "compute1"));
        assert!(m("n[[:digit:]]*", "n1x"));
        assert!(!m("n[[:digit:]]*", "nx"));
        assert!(m("+(gpu|cpu)*", "cpu12"));
        assert!(!m("+(gpu|cpu)*", "login1"));
        assert!(!m("!login*", "login1"));
    }

    #[test]
    fn regexes_are_unanchored() {
        assert!(m("/Linux/", "GNU/Linux"));
        assert!(m("/(^|,)rw($|,)/", "rw,relatime"));
        assert!(!m("/(^|,)rw($|,)/", "ro,relatime,rwx"));
        assert!(m("/^gpu-[0-9]+$/", "gpu-17"));
        assert!(m("/[[:space:]]x/", "a x"));
        // POSIX ERE, not Perl: `\d` is a plain `d` to glibc.
        assert!(!m("/^n\\d+$/", "n12"));
        assert!(m("/^n[[:digit:]]+$/", "n12"));
        assert!(m("!/^login/", "compute"));
        assert!(Matcher::parse("/(unclosed/").is_err());
    }

    #[test]
    fn node_ranges() {
        assert!(m("{n[01-16]}", "n05"));
        assert!(!m("{n[01-16]}", "n5"));
        assert!(!m("{n[01-16]}", "n17"));
        // NHC's mcheck_range: the width of the longer bound, whatever the start says.
        assert!(!m("{n[1-10]}", "n5"));
        assert!(m("{n[1-10]}", "n05"));
        assert!(m("{n[1-10]}", "n10"));
        assert!(m("{n[1-16]}", "n01"));
        assert!(!m("{n[1-16]}", "n1"));
        assert!(m("{n[16-1]}", "n09"));
        assert!(m("{login1,gpu[1-3,7]}", "gpu7"));
        assert!(m("{login1,gpu[1-3,7]}", "login1"));
        assert!(!m("{login1,gpu[1-3,7]}", "gpu5"));
        assert!(m("{c[1-4].ib}", "c3.ib"));
        assert!(!m("{c[1-4].ib}", "c3"));
        assert!(m("!{n[1-2]}", "n3"));
        for bad in ["{n[1-}", "{n[a-b]}", "{a b}", "{n[1-2}", "{}"] {
            assert!(Matcher::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mount_options_and_literals() {
        let rw = Matcher::mount_option("rw");
        assert!(rw.matches("rw,nosuid"));
        assert!(!rw.matches("ro,nosuid"));
        assert!(Matcher::literal("a*b").matches("a*b"));
        assert!(!Matcher::literal("a*b").matches("axb"));
    }
}
