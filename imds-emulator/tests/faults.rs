//! Fault injection over real HTTP: each status, targets, counts, clearing, delays and
//! dropped connections.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::ErrorKind;
use std::time::Duration;

use common::{get, request, token, try_request};
use imds_emulator::{Config, Emulator, Fault, FaultTarget, RequestRecord};

const TTL: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const ID: &str = "/latest/meta-data/instance-id";

fn start() -> Emulator {
    Emulator::start(Config::default()).unwrap()
}

fn put_token(emu: &Emulator) -> common::Resp {
    request(emu.addr(), "PUT", "/latest/api/token", &[(TTL, "60")], b"")
}

#[test]
fn each_status_on_gets_leaves_the_token_put_alone() {
    let emu = start();
    for (code, title) in [
        (401, "401 - Unauthorized"),
        (403, "403 - Forbidden"),
        (429, "429 - Too Many Requests"),
        (500, "500 - Internal Server Error"),
        (503, "503 - Service Unavailable"),
    ] {
        emu.inject(Fault::status(code).on(FaultTarget::Get).times(1));
        let t = token(emu.addr(), "60");
        let resp = get(emu.addr(), ID, &t);
        assert_eq!(resp.status, code);
        assert!(resp.text().contains(title), "{}", resp.text());
        assert_eq!(get(emu.addr(), ID, &t).status, 200, "after {code}");
    }
    // The injected 401 has IMDS's own 401 page.
    emu.inject(Fault::status(401).on(FaultTarget::Get).times(1));
    let t = token(emu.addr(), "60");
    assert_eq!(
        get(emu.addr(), ID, &t).body,
        common::golden("401_response.golden")
    );
}

#[test]
fn each_status_on_the_token_put_leaves_gets_alone() {
    let emu = start();
    let t = token(emu.addr(), "60");
    for code in [401, 403, 429, 500, 503] {
        emu.inject(Fault::status(code).on(FaultTarget::Token).times(1));
        assert_eq!(put_token(&emu).status, code);
        assert_eq!(get(emu.addr(), ID, &t).status, 200);
        assert_eq!(put_token(&emu).status, 200);
    }
}

#[test]
fn count_and_until_cleared() {
    let emu = start();
    emu.inject(Fault::status(503).times(2));
    assert_eq!(put_token(&emu).status, 503);
    assert_eq!(request(emu.addr(), "GET", ID, &[], b"").status, 503);
    let t = token(emu.addr(), "60");

    emu.inject(Fault::status(429));
    for _ in 0..5 {
        assert_eq!(get(emu.addr(), ID, &t).status, 429);
        assert_eq!(put_token(&emu).status, 429);
    }
    emu.clear_faults();
    assert_eq!(get(emu.addr(), ID, &t).status, 200);
}

#[test]
fn delay_holds_the_answer_back_then_answers() {
    let emu = start();
    let t = token(emu.addr(), "60");
    // A client that gives up before the delay ends sees a timeout...
    emu.inject(
        Fault::delay(Duration::from_secs(30))
            .on(FaultTarget::Get)
            .times(1),
    );
    let err = try_request(
        emu.addr(),
        "GET",
        ID,
        &[("X-aws-ec2-metadata-token", &t)],
        b"",
        Duration::from_millis(300),
    )
    .unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    // ... one that waits gets the normal answer.
    emu.inject(
        Fault::delay(Duration::from_millis(200))
            .on(FaultTarget::Get)
            .times(1),
    );
    let resp = get(emu.addr(), ID, &t);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "i-1234567890abcdef0");
    // A delay before a status: both apply.
    emu.inject(Fault::delay(Duration::from_millis(50)).times(1));
    emu.inject(Fault::status(500).times(1));
    assert_eq!(get(emu.addr(), ID, &t).status, 500);
    assert_eq!(get(emu.addr(), ID, &t).status, 200);
}

#[test]
fn drop_closes_the_connection_without_an_answer() {
    let emu = start();
    emu.inject(Fault::drop_connection().on(FaultTarget::Token).times(1));
    let err = try_request(
        emu.addr(),
        "PUT",
        "/latest/api/token",
        &[(TTL, "60")],
        b"",
        Duration::from_secs(30),
    )
    .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
        ),
        "{err:?}"
    );
    let t = token(emu.addr(), "60");
    emu.inject(Fault::drop_connection().on(FaultTarget::Get));
    for _ in 0..2 {
        assert!(try_request(
            emu.addr(),
            "GET",
            ID,
            &[("X-aws-ec2-metadata-token", &t)],
            b"",
            Duration::from_secs(30)
        )
        .is_err());
    }
    emu.clear_faults();
    assert_eq!(get(emu.addr(), ID, &t).status, 200);
    let log = emu.requests();
    assert_eq!(
        log[0],
        RequestRecord {
            method: "PUT".into(),
            path: "/latest/api/token".into(),
            status: None
        }
    );
    assert_eq!(log.iter().filter(|r| r.status.is_none()).count(), 3);
}

#[test]
fn control_api_is_never_faulted() {
    let emu = start();
    emu.inject(Fault::status(500));
    let resp = request(
        emu.addr(),
        "PUT",
        "/__emulator/meta-data/mac",
        &[],
        b"aa:bb",
    );
    assert_eq!(resp.status, 204);
    let resp = request(emu.addr(), "DELETE", "/__emulator/fault", &[], b"");
    assert_eq!(resp.status, 204);
    let t = token(emu.addr(), "60");
    assert_eq!(get(emu.addr(), "/latest/meta-data/mac", &t).text(), "aa:bb");
}
