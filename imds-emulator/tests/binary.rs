//! The `imds-emulator` binary: flags, the printed endpoint, the port file, the control
//! API, and a clean exit on SIGTERM.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use common::{get, request, token};

/// Kills the emulator process on drop, so a failing test leaves nothing running.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(args: &[&str]) -> (Guard, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_imds-emulator"))
        .args(["--bind", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let guard = Guard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    (guard, addr)
}

#[test]
fn flags_set_the_initial_state() {
    let dir = tempfile::tempdir().unwrap();
    let port_file = dir.path().join("port");
    let user_data = dir.path().join("user-data");
    std::fs::write(&user_data, b"#cloud-config\n").unwrap();
    let (_guard, addr) = spawn(&[
        "--port-file",
        port_file.to_str().unwrap(),
        "--clear-tags",
        "--tag",
        "slurm:node-name=n1",
        "--tag",
        "k=a=b",
        "--user-data-file",
        user_data.to_str().unwrap(),
        "--set",
        "instance-type=c5.large",
        "--set",
        "placement/region=eu-west-1",
    ]);
    assert_eq!(
        std::fs::read_to_string(&port_file).unwrap(),
        format!("{}\n", addr.port())
    );
    let t = token(addr, "60");
    assert_eq!(
        get(addr, "/latest/meta-data/tags/instance", &t).text(),
        "k\nslurm:node-name"
    );
    assert_eq!(
        get(addr, "/latest/meta-data/tags/instance/k", &t).text(),
        "a=b"
    );
    assert_eq!(get(addr, "/latest/user-data", &t).text(), "#cloud-config\n");
    assert_eq!(
        get(addr, "/latest/meta-data/instance-type", &t).text(),
        "c5.large"
    );
    assert_eq!(
        get(addr, "/latest/meta-data/placement/region", &t).text(),
        "eu-west-1"
    );
    // IMDSv2 is required by default.
    assert_eq!(
        request(addr, "GET", "/latest/meta-data/ami-id", &[], b"").status,
        401
    );
}

#[test]
fn imdsv1_and_no_user_data_flags() {
    let (_guard, addr) = spawn(&["--allow-imdsv1", "--no-user-data"]);
    assert_eq!(
        request(addr, "GET", "/latest/meta-data/ami-id", &[], b"").status,
        200
    );
    assert_eq!(
        request(addr, "GET", "/latest/user-data", &[], b"").status,
        404
    );
}

#[test]
fn bad_flags_are_refused_with_the_flag_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_imds-emulator"))
        .args(["--bind", "127.0.0.1:0", "--tag", "novalue"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--tag") && err.contains("KEY=VALUE"), "{err}");

    let out = Command::new(env!("CARGO_BIN_EXE_imds-emulator"))
        .args([
            "--bind",
            "127.0.0.1:0",
            "--user-data-file",
            "/nonexistent/ud",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--user-data-file /nonexistent/ud"), "{err}");
}

#[test]
fn control_api_changes_state_while_running() {
    let (_guard, addr) = spawn(&[]);
    let ctl = |method: &str, path: &str, body: &[u8]| request(addr, method, path, &[], body);
    let t = token(addr, "600");
    let md = |p: &str| get(addr, &format!("/latest/meta-data/{p}"), &t);

    // meta-data paths, including the event paths.
    assert_eq!(
        ctl("PUT", "/__emulator/meta-data/instance-id", b"i-0abc").status,
        204
    );
    assert_eq!(md("instance-id").text(), "i-0abc");
    let ia = br#"{"action": "stop", "time": "2017-09-18T08:22:00Z"}"#;
    assert_eq!(
        ctl("PUT", "/__emulator/meta-data/spot/instance-action", ia).status,
        204
    );
    assert_eq!(md("spot/instance-action").body, ia);
    assert_eq!(ctl("DELETE", "/__emulator/meta-data/spot", b"").status, 204);
    assert_eq!(md("spot/instance-action").status, 404);
    assert_eq!(
        ctl("DELETE", "/__emulator/meta-data/instance-id", b"").status,
        204
    );
    assert_eq!(md("instance-id").status, 404);
    assert_eq!(
        ctl(
            "PUT",
            "/__emulator/dynamic/instance-identity/document",
            b"{}"
        )
        .status,
        204
    );
    assert_eq!(
        get(addr, "/latest/dynamic/instance-identity/document", &t).text(),
        "{}"
    );

    // A scheduled maintenance event ends: moved to history.
    let ev = br#"[{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "Description": "scheduled reboot", "EventId": "instance-event-1", "NotAfter": "", "State": "active"}]"#;
    assert_eq!(
        ctl(
            "PUT",
            "/__emulator/meta-data/events/maintenance/scheduled",
            ev
        )
        .status,
        204
    );
    assert_eq!(
        ctl(
            "POST",
            "/__emulator/maintenance/instance-event-1/bogus",
            b""
        )
        .status,
        400
    );
    assert_eq!(
        ctl(
            "POST",
            "/__emulator/maintenance/instance-event-2/canceled",
            b""
        )
        .status,
        400
    );
    assert_eq!(
        ctl(
            "POST",
            "/__emulator/maintenance/instance-event-1/canceled",
            b""
        )
        .status,
        204
    );
    assert_eq!(md("events/maintenance/scheduled").status, 404);
    assert!(md("events/maintenance/history")
        .text()
        .contains("\"State\": \"canceled\""));

    // Tags.
    assert_eq!(
        ctl("PUT", "/__emulator/tags/slurm%3Anode-name", b"n7").status,
        204
    );
    assert_eq!(md("tags/instance/slurm:node-name").text(), "n7");
    assert_eq!(ctl("DELETE", "/__emulator/tags/Name", b"").status, 204);
    assert_eq!(md("tags/instance").text(), "Test\nslurm:node-name");
    assert_eq!(ctl("DELETE", "/__emulator/tags", b"").status, 204);
    assert_eq!(md("tags/instance").status, 404);

    // User data.
    assert_eq!(
        ctl("PUT", "/__emulator/user-data", b"\x00\x01binary").status,
        204
    );
    assert_eq!(get(addr, "/latest/user-data", &t).body, b"\x00\x01binary");
    assert_eq!(ctl("DELETE", "/__emulator/user-data", b"").status, 204);
    assert_eq!(get(addr, "/latest/user-data", &t).status, 404);

    // Faults.
    let fault = br#"{"status": 503, "on": "token", "count": 1}"#;
    assert_eq!(ctl("POST", "/__emulator/fault", fault).status, 204);
    let ttl = [("X-aws-ec2-metadata-token-ttl-seconds", "60")];
    assert_eq!(
        request(addr, "PUT", "/latest/api/token", &ttl, b"").status,
        503
    );
    assert_eq!(
        request(addr, "PUT", "/latest/api/token", &ttl, b"").status,
        200
    );
    assert_eq!(
        ctl(
            "POST",
            "/__emulator/fault",
            br#"{"status": 429, "on": "get"}"#
        )
        .status,
        204
    );
    assert_eq!(md("mac").status, 429);
    assert_eq!(ctl("DELETE", "/__emulator/fault", b"").status, 204);
    assert_eq!(md("mac").status, 200);
    assert_eq!(
        ctl(
            "POST",
            "/__emulator/fault",
            br#"{"drop": true, "count": 1}"#
        )
        .status,
        204
    );
    assert!(common::try_request(
        addr,
        "GET",
        "/latest/meta-data/mac",
        &[("X-aws-ec2-metadata-token", &t)],
        b"",
        std::time::Duration::from_secs(30)
    )
    .is_err());
    let bad = ctl(
        "POST",
        "/__emulator/fault",
        br#"{"status": 503, "drop": true}"#,
    );
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("exactly one of"), "{}", bad.text());
    let bad = ctl(
        "POST",
        "/__emulator/fault",
        br#"{"status": 503, "on": "sometimes"}"#,
    );
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("unknown variant"), "{}", bad.text());

    // Tokens and IMDSv1.
    assert_eq!(ctl("DELETE", "/__emulator/tokens", b"").status, 204);
    assert_eq!(md("mac").status, 401);
    assert_eq!(ctl("PUT", "/__emulator/imdsv1", b"true").status, 204);
    assert_eq!(
        request(addr, "GET", "/latest/meta-data/mac", &[], b"").status,
        200
    );
    assert_eq!(ctl("PUT", "/__emulator/imdsv1", b"maybe").status, 400);

    // The request log.
    let log = ctl("GET", "/__emulator/requests", b"");
    assert_eq!(log.status, 200);
    let log: serde_json::Value = serde_json::from_slice(&log.body).unwrap();
    let last = log.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last,
        serde_json::json!({"method": "GET", "path": "/latest/meta-data/mac", "status": 200})
    );
    assert!(log
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["status"].is_null()));

    // Unknown routes say so.
    let resp = ctl("PUT", "/__emulator/nothing", b"");
    assert_eq!(resp.status, 404);
    assert!(resp
        .text()
        .contains("no control route PUT /__emulator/nothing"));
}

#[test]
fn no_control_api_flag_turns_it_off() {
    let (_guard, addr) = spawn(&["--no-control-api"]);
    let t = token(addr, "60");
    let resp = request(addr, "PUT", "/__emulator/user-data", &[], b"x");
    assert_eq!(resp.status, 405);
    assert_eq!(get(addr, "/__emulator/requests", &t).status, 404);
}

#[test]
fn sigterm_stops_it_cleanly() {
    let (mut guard, addr) = spawn(&[]);
    token(addr, "60");
    let status = Command::new("kill")
        .args(["-TERM", &guard.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = guard.0.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}
