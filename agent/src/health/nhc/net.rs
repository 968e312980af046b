//! NHC's `lbnl_net.nhc` functions translated to the engine's checks: check_net_socket, check_net_ping.

use super::*;

/// `check_net_socket [-0] [-a] [-!] [-n name] [-p proto] [-s state] [-l locaddr] [-r
/// rmtaddr] [-t type] [-u user] [-d daemon] [-e action] [-E found_action]`.
pub(super) fn socket(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let (opts, rest) = getopts(args, "!0ad:l:n:p:r:s:t:u:e:E:")?;
    if !rest.is_empty() {
        return Err(NhcError::ExtraArguments {
            arguments: rest.join(" "),
        });
    }
    let mut spec = SocketSpec {
        name: None,
        proto: None,
        local: None,
        remote: None,
        state: None,
        kind: None,
        user: None,
        daemon: None,
        negate: false,
        all: false,
        missing_action: Vec::new(),
        found_action: Vec::new(),
    };
    let mut fatal = true;
    // NHC: an empty value is no criterion.
    let m = |v: &str| -> Result<Option<Matcher>, NhcError> {
        if v.is_empty() {
            Ok(None)
        } else {
            matcher(v).map(Some)
        }
    };
    for (c, v) in opts {
        match c {
            '!' => spec.negate = true,
            '0' => fatal = false,
            'a' => spec.all = true,
            'n' => spec.name = Some(v),
            'p' => spec.proto = m(&v)?,
            'l' => spec.local = m(&v)?,
            'r' => spec.remote = m(&v)?,
            's' => spec.state = m(&v)?,
            't' => spec.kind = m(&v)?,
            'u' => spec.user = m(&v)?,
            'd' => spec.daemon = m(&v)?,
            // NHC runs these with `bash -c`; the agent runs the program with its words.
            'e' | 'E' => {
                let words = shell_words(&v, &[]).map_err(|source| NhcError::ActionWords {
                    option: c,
                    value: v.clone(),
                    source,
                })?;
                if c == 'e' {
                    spec.missing_action = words;
                } else {
                    spec.found_action = words;
                }
            }
            _ => {}
        }
    }
    if [
        &spec.proto,
        &spec.local,
        &spec.remote,
        &spec.state,
        &spec.kind,
        &spec.user,
        &spec.daemon,
    ]
    .iter()
    .all(|m| m.is_none())
    {
        return Err(NhcError::NoMatchCriteria);
    }
    Ok(vec![(
        String::new(),
        CheckKind::NetSocket(Box::new(spec)),
        fatal,
        cx.timeout,
    )])
}

/// `check_net_ping [-I address|interface] [-i interval] [-s size] [-t ttl] [-c count] [-w deadline]
/// [-W timeout] target...`: one check per target. NHC's defaults: 1 request, TTL 2, 1 s
/// deadline.
pub(super) fn ping(_name: &str, args: &[String], cx: &Cx) -> Result<Built, NhcError> {
    let (opts, targets) = getopts(args, "I:W:c:i:s:t:w:")?;
    if targets.is_empty() {
        return Err(NhcError::NoPingTarget);
    }
    let secs = |c: char, v: &str| -> Result<Option<Duration>, NhcError> {
        if v.is_empty() {
            return Ok(None);
        }
        v.parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| NhcError::NotSeconds {
                option: c,
                value: v.to_string(),
            })
    };
    let num = |c: char, v: &str| -> Result<u32, NhcError> {
        v.parse().map_err(|_| NhcError::OptionNotWholeNumber {
            option: c,
            value: v.to_string(),
        })
    };
    let mut base = PingSpec {
        target: String::new(),
        count: 1,
        deadline: Some(Duration::from_secs(1)),
        wait: Duration::from_secs(10),
        interval: Duration::from_secs(1),
        size: 56,
        ttl: Some(2),
        source: None,
        device: None,
    };
    for (c, v) in opts {
        match c {
            'c' => base.count = num(c, &v)?.max(1),
            'w' => base.deadline = secs(c, &v)?,
            'W' => base.wait = secs(c, &v)?.unwrap_or(base.wait),
            'i' => base.interval = secs(c, &v)?.unwrap_or(base.interval),
            's' => base.size = num(c, &v)? as usize,
            't' => base.ttl = Some(num(c, &v)?),
            // ping's -I: an address, or else an interface name.
            'I' => match v.parse() {
                Ok(a) => base.source = Some(a),
                Err(_) if !v.is_empty() && v.len() < 16 && !v.contains(['/', ' ']) => {
                    base.device = Some(v)
                }
                Err(_) => return Err(NhcError::NotAddressOrInterface { value: v }),
            },
            _ => {}
        }
    }
    if base.size > 65000 {
        return Err(NhcError::PacketTooLarge { size: base.size });
    }
    // The check's own limit covers the whole exchange.
    let needed = base
        .deadline
        .unwrap_or(base.interval * base.count + base.wait)
        + Duration::from_secs(2);
    let timeout = cx.timeout.max(needed);
    Ok(targets
        .iter()
        .map(|t| {
            (
                t.clone(),
                CheckKind::Ping(PingSpec {
                    target: t.clone(),
                    ..base.clone()
                }),
                true,
                timeout,
            )
        })
        .collect())
}
