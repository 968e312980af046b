//! bash integer arithmetic (`$(( ... ))`, and the subscripts of NHC's indexed arrays), as
//! the bash manual's "Shell Arithmetic" section specifies it: 64-bit signed integers with
//! wrapping, constants `0x1f` (hex), `017` (octal, leading 0), `base#digits` (2 to 64) and
//! decimal; variables (unset or empty: 0); unary `- + ! ~`; binary `** * / % + - << >> <
//! <= > >= == != & ^ | && ||` with C precedence; parentheses. Division by zero is an
//! error, as in bash.

/// A bash arithmetic expression or constant that cannot be evaluated; each variant
/// holds the expression (or constant) as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArithError {
    /// A constant with a digit its base does not have, or no digits.
    #[error("{value:?}: not a bash integer (value too great for base)")]
    NotAnInteger {
        /// The constant (or a variable's value) as written.
        value: String,
    },
    /// `base#digits` with a base outside 2 to 64.
    #[error("{value:?}: invalid arithmetic base")]
    InvalidBase {
        /// The constant as written.
        value: String,
    },
    /// A character that is no operator, number or variable.
    #[error("{expr:?}: unsupported arithmetic at {at:?}")]
    Unsupported {
        /// The expression.
        expr: String,
        /// The character.
        at: char,
    },
    /// Operators and operands out of order, or unbalanced parentheses.
    #[error("{expr:?}: arithmetic syntax error")]
    Syntax {
        /// The expression.
        expr: String,
    },
    /// `/ 0` or `% 0`.
    #[error("{expr:?}: division by 0")]
    DivisionByZero {
        /// The expression.
        expr: String,
    },
    /// `** n` with n < 0.
    #[error("{expr:?}: exponent less than 0")]
    NegativeExponent {
        /// The expression.
        expr: String,
    },
}

/// Parses a bash integer constant: `0x..`/`0X..` hex, a leading `0` octal, `base#digits`,
/// else decimal; an optional leading sign.
///
/// # Errors
/// [`ArithError::NotAnInteger`] (bash: "value too great for base"),
/// [`ArithError::InvalidBase`].
pub fn parse_int(s: &str) -> Result<i64, ArithError> {
    let t = s.trim();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let bad = || ArithError::NotAnInteger {
        value: s.to_string(),
    };
    let (base, digits) = if let Some((b, d)) = t.split_once('#') {
        let b: u32 = b.parse().map_err(|_| bad())?;
        if !(2..=64).contains(&b) {
            return Err(ArithError::InvalidBase {
                value: s.to_string(),
            });
        }
        (b, d)
    } else if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        (16, h)
    } else if t.len() > 1 && t.starts_with('0') {
        (8, &t[1..])
    } else {
        (10, t)
    };
    if digits.is_empty() {
        return Err(bad());
    }
    let mut v: i64 = 0;
    for c in digits.chars() {
        // bash: 0-9, a-z, A-Z, @, _ (letters case-insensitive up to base 36).
        let d = match c {
            '0'..='9' => c as u32 - '0' as u32,
            'a'..='z' => c as u32 - 'a' as u32 + 10,
            'A'..='Z' if base <= 36 => c as u32 - 'A' as u32 + 10,
            'A'..='Z' => c as u32 - 'A' as u32 + 36,
            '@' => 62,
            '_' => 63,
            _ => return Err(bad()),
        };
        if d >= base {
            return Err(bad());
        }
        v = v.wrapping_mul(i64::from(base)).wrapping_add(i64::from(d));
    }
    Ok(if neg { v.wrapping_neg() } else { v })
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(i64),
    Op(&'static str),
    Open,
    Close,
}

const OPS: &[&str] = &[
    "**", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||", "*", "/", "%", "+", "-", "<", ">", "&",
    "^", "|", "!", "~",
];

fn lex(s: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Tok>, ArithError> {
    let b: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '(' {
            out.push(Tok::Open);
            i += 1;
        } else if c == ')' {
            out.push(Tok::Close);
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            if c == '$' {
                i += 1;
            }
            while i < b.len()
                && (b[i].is_ascii_alphanumeric() || b[i] == '_' || b[i] == '#' || b[i] == '@')
            {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            let word = word.trim_start_matches('$');
            if word.starts_with(|c: char| c.is_ascii_digit()) {
                out.push(Tok::Num(parse_int(word)?));
            } else {
                // A variable: its value read as an integer (unset or empty: 0).
                let v = var(word).unwrap_or_default();
                out.push(Tok::Num(if v.trim().is_empty() {
                    0
                } else {
                    parse_int(&v)?
                }));
            }
        } else {
            let rest: String = b[i..b.len().min(i + 2)].iter().collect();
            let op = OPS.iter().find(|o| rest.starts_with(**o)).ok_or_else(|| {
                ArithError::Unsupported {
                    expr: s.to_string(),
                    at: c,
                }
            })?;
            out.push(Tok::Op(op));
            i += op.len();
        }
    }
    Ok(out)
}

fn prec(op: &str) -> Option<(u8, bool)> {
    // (precedence, right associative)
    Some(match op {
        "||" => (1, false),
        "&&" => (2, false),
        "|" => (3, false),
        "^" => (4, false),
        "&" => (5, false),
        "==" | "!=" => (6, false),
        "<" | "<=" | ">" | ">=" => (7, false),
        "<<" | ">>" => (8, false),
        "+" | "-" => (9, false),
        "*" | "/" | "%" => (10, false),
        "**" => (12, true),
        _ => return None,
    })
}

struct P<'a> {
    t: &'a [Tok],
    i: usize,
    src: &'a str,
}

impl P<'_> {
    fn err(&self) -> ArithError {
        ArithError::Syntax {
            expr: self.src.to_string(),
        }
    }

    fn unary(&mut self) -> Result<i64, ArithError> {
        match self.t.get(self.i).cloned() {
            Some(Tok::Num(n)) => {
                self.i += 1;
                Ok(n)
            }
            Some(Tok::Open) => {
                self.i += 1;
                let v = self.expr(0)?;
                if self.t.get(self.i) != Some(&Tok::Close) {
                    return Err(self.err());
                }
                self.i += 1;
                Ok(v)
            }
            Some(Tok::Op(op @ ("-" | "+" | "!" | "~"))) => {
                self.i += 1;
                // Unary operators bind tighter than every binary one, `**` included
                // (bash: `-2**2` is 4).
                let v = self.unary()?;
                Ok(match op {
                    "-" => v.wrapping_neg(),
                    "+" => v,
                    "!" => i64::from(v == 0),
                    _ => !v,
                })
            }
            _ => Err(self.err()),
        }
    }

    fn expr(&mut self, min: u8) -> Result<i64, ArithError> {
        let mut lhs = self.unary()?;
        while let Some(Tok::Op(op)) = self.t.get(self.i).cloned() {
            let Some((p, right)) = prec(op) else { break };
            if p < min {
                break;
            }
            self.i += 1;
            let rhs = self.expr(if right { p } else { p + 1 })?;
            lhs = match op {
                "||" => i64::from(lhs != 0 || rhs != 0),
                "&&" => i64::from(lhs != 0 && rhs != 0),
                "|" => lhs | rhs,
                "^" => lhs ^ rhs,
                "&" => lhs & rhs,
                "==" => i64::from(lhs == rhs),
                "!=" => i64::from(lhs != rhs),
                "<" => i64::from(lhs < rhs),
                "<=" => i64::from(lhs <= rhs),
                ">" => i64::from(lhs > rhs),
                ">=" => i64::from(lhs >= rhs),
                "<<" => lhs.wrapping_shl(rhs as u32),
                ">>" => lhs.wrapping_shr(rhs as u32),
                "+" => lhs.wrapping_add(rhs),
                "-" => lhs.wrapping_sub(rhs),
                "*" => lhs.wrapping_mul(rhs),
                "/" | "%" if rhs == 0 => {
                    return Err(ArithError::DivisionByZero {
                        expr: self.src.to_string(),
                    })
                }
                "/" => lhs.wrapping_div(rhs),
                "%" => lhs.wrapping_rem(rhs),
                "**" if rhs < 0 => {
                    return Err(ArithError::NegativeExponent {
                        expr: self.src.to_string(),
                    })
                }
                _ => lhs.wrapping_pow(u32::try_from(rhs).unwrap_or(u32::MAX)),
            };
        }
        Ok(lhs)
    }
}

/// Evaluates a bash arithmetic expression; `var` gives a variable's value.
///
/// # Errors
/// [`ArithError`] naming the expression: syntax, a bad constant, division by zero.
pub fn eval(s: &str, var: &dyn Fn(&str) -> Option<String>) -> Result<i64, ArithError> {
    let toks = lex(s, var)?;
    if toks.is_empty() {
        return Ok(0);
    }
    let mut p = P {
        t: &toks,
        i: 0,
        src: s,
    };
    let v = p.expr(0)?;
    if p.i != toks.len() {
        return Err(p.err());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn e(s: &str) -> Result<i64, ArithError> {
        eval(s, &|n| (n == "N").then(|| "4".to_string()))
    }

    #[test]
    fn bash_constants() {
        assert_eq!(parse_int("0x400").unwrap(), 1024);
        assert_eq!(parse_int("0400").unwrap(), 256);
        assert_eq!(parse_int("1024").unwrap(), 1024);
        assert_eq!(parse_int("0").unwrap(), 0);
        assert_eq!(parse_int("2#101").unwrap(), 5);
        assert_eq!(parse_int("-0x10").unwrap(), -16);
        assert!(parse_int("09").is_err());
        assert!(parse_int("0x").is_err());
        assert!(parse_int("abc").is_err());
    }

    #[test]
    fn bash_expressions() {
        assert_eq!(e("1 + 2 * 3").unwrap(), 7);
        assert_eq!(e("(1 + 2) * 3").unwrap(), 9);
        assert_eq!(e("N * 2").unwrap(), 8);
        assert_eq!(e("$N * 2").unwrap(), 8);
        assert_eq!(e("UNSET + 1").unwrap(), 1);
        assert_eq!(e("-2 ** 2").unwrap(), 4);
        assert_eq!(e("2 ** 3 ** 2").unwrap(), 512);
        assert_eq!(e("7 / 2 + 7 % 2").unwrap(), 4);
        assert_eq!(e("1 << 4 | 1").unwrap(), 17);
        assert_eq!(e("3 > 2 && 2 > 3").unwrap(), 0);
        assert_eq!(e("!0 + ~0").unwrap(), 0);
        assert_eq!(e("010 + 0x10").unwrap(), 24);
        assert!(e("1 / 0")
            .unwrap_err()
            .to_string()
            .contains("division by 0"));
        assert!(e("1 +").is_err());
        assert!(e("(1").is_err());
    }
}
