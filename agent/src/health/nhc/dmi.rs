//! NHC's `lbnl_dmi.nhc` functions translated to the engine's checks: check_dmi_data_match, check_dmi_raw_data_match.

use super::*;

/// `check_dmi_raw_data_match [!] expr...`: a line of `dmidecode`'s own output (not
/// flattened) must match, or with `!` none may.
pub(super) fn raw_data_match(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let mut rest = args;
    let mut negate = false;
    if rest.first().map(String::as_str) == Some("!") {
        negate = true;
        rest = &rest[1..];
    }
    // NHC matches `$*`: the words joined by single spaces (an empty expression included).
    Ok(one(
        CheckKind::Dmi(DmiSpec {
            negate,
            handles: Vec::new(),
            type_filter: None,
            pattern: matcher(&rest.join(" "))?,
            raw: true,
        }),
        cx.timeout,
    ))
}

/// `check_dmi_data_match`.
pub(super) fn data_match(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let timeout = cx.timeout;
    let (opts, mut rest) = getopts(args, "!h:nt:")?;
    let mut spec = DmiSpec {
        negate: false,
        handles: Vec::new(),
        type_filter: None,
        pattern: Matcher::parse("*")?,
        raw: false,
    };
    for (c, v) in opts {
        match c {
            '!' | 'n' => spec.negate = true,
            // `HANDLES=( $OPTARG )`, each a bash array subscript: arithmetic.
            'h' => {
                spec.handles = v
                    .split_whitespace()
                    .map(|w| {
                        crate::health::arith::eval(w, &|_| None).map_err(|source| {
                            NhcError::NotADmiHandle {
                                value: w.to_string(),
                                source,
                            }
                        })
                    })
                    .collect::<Result<_, _>>()?
            }
            't' => spec.type_filter = Some(v),
            _ => {}
        }
    }
    if rest.first().map(String::as_str) == Some("!") {
        spec.negate = true;
        rest.remove(0);
    }
    if rest.is_empty() {
        return Err(NhcError::NoMatchExpression);
    }
    spec.pattern = matcher(&rest.join(" "))?;
    Ok(one(CheckKind::Dmi(spec), timeout))
}
