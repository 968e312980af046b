//! The metadata service over real HTTP on 127.0.0.1: the IMDSv2 token flow, token
//! enforcement, AEMM's defaults, golden bodies and listings, tags, user data and the
//! event paths.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{get, golden, request, token};
use imds_emulator::{Config, Emulator, EventOutcome, RequestRecord};

fn start() -> Emulator {
    Emulator::start(Config::default()).unwrap()
}

const TTL: &str = "X-aws-ec2-metadata-token-ttl-seconds";

#[test]
fn token_put_returns_token_and_echoes_ttl() {
    let emu = start();
    let resp = request(
        emu.addr(),
        "PUT",
        "/latest/api/token",
        &[(TTL, "21600")],
        b"",
    );
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header(TTL), Some("21600"));
    let token = resp.text();
    assert!(token.len() >= 40, "token {token:?}");
    let other = common::token(emu.addr(), "60");
    assert_ne!(token, other);
    let resp = get(emu.addr(), "/latest/meta-data/instance-id", &token);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "i-1234567890abcdef0");
}

#[test]
fn bad_or_missing_ttl_is_400_with_golden_body() {
    let emu = start();
    for ttl in ["0", "21601", "-1", "abc", ""] {
        let resp = request(emu.addr(), "PUT", "/latest/api/token", &[(TTL, ttl)], b"");
        assert_eq!(resp.status, 400, "ttl {ttl:?}");
        assert_eq!(resp.body, golden("400_response.golden"), "ttl {ttl:?}");
    }
    let resp = request(emu.addr(), "PUT", "/latest/api/token", &[], b"");
    assert_eq!(resp.status, 400);
    assert_eq!(resp.body, golden("400_response.golden"));
    // The bounds themselves are accepted.
    token(emu.addr(), "1");
    token(emu.addr(), "21600");
}

#[test]
fn token_put_with_x_forwarded_for_is_403() {
    let emu = start();
    let resp = request(
        emu.addr(),
        "PUT",
        "/latest/api/token",
        &[(TTL, "60"), ("X-Forwarded-For", "10.0.0.1")],
        b"",
    );
    assert_eq!(resp.status, 403);
    assert!(resp.text().contains("403 - Forbidden"));
}

#[test]
fn get_without_or_with_unknown_token_is_401_with_golden_body() {
    let emu = start();
    for path in [
        "/latest/meta-data/instance-id",
        "/latest/meta-data/absent",
        "/",
    ] {
        let resp = request(emu.addr(), "GET", path, &[], b"");
        assert_eq!(resp.status, 401, "{path}");
        assert_eq!(resp.body, golden("401_response.golden"));
    }
    let resp = get(emu.addr(), "/latest/meta-data/instance-id", "not-a-token");
    assert_eq!(resp.status, 401);
    assert_eq!(resp.body, golden("401_response.golden"));
}

#[test]
fn token_expires_after_its_ttl() {
    let emu = start();
    let short = token(emu.addr(), "1");
    let long = token(emu.addr(), "600");
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/ami-id", &short).status,
        200
    );
    std::thread::sleep(Duration::from_millis(1100));
    let resp = get(emu.addr(), "/latest/meta-data/ami-id", &short);
    assert_eq!(resp.status, 401);
    assert_eq!(resp.body, golden("401_response.golden"));
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/ami-id", &long).status,
        200
    );
}

#[test]
fn expire_tokens_invalidates_every_token() {
    let emu = start();
    let t = token(emu.addr(), "600");
    emu.expire_tokens();
    assert_eq!(get(emu.addr(), "/latest/meta-data/ami-id", &t).status, 401);
    let t = token(emu.addr(), "600");
    assert_eq!(get(emu.addr(), "/latest/meta-data/ami-id", &t).status, 200);
}

#[test]
fn imdsv1_only_when_allowed() {
    let emu = Emulator::start(Config {
        allow_imdsv1: true,
        ..Config::default()
    })
    .unwrap();
    let resp = request(emu.addr(), "GET", "/latest/meta-data/instance-id", &[], b"");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.text(), "i-1234567890abcdef0");
    // An invalid token is refused even when IMDSv1 is allowed, as on EC2.
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/instance-id", "bogus").status,
        401
    );
    emu.set_allow_imdsv1(false);
    let resp = request(emu.addr(), "GET", "/latest/meta-data/instance-id", &[], b"");
    assert_eq!(resp.status, 401);
}

#[test]
fn wrong_methods_are_405() {
    let emu = start();
    let resp = request(emu.addr(), "GET", "/latest/api/token", &[(TTL, "60")], b"");
    assert_eq!(resp.status, 405);
    let t = token(emu.addr(), "60");
    let resp = request(
        emu.addr(),
        "POST",
        "/latest/meta-data/instance-id",
        &[("X-aws-ec2-metadata-token", &t)],
        b"x",
    );
    assert_eq!(resp.status, 405);
}

#[test]
fn absent_paths_are_404_with_golden_body() {
    let emu = start();
    let t = token(emu.addr(), "60");
    for path in [
        "/womp",
        "/latest/meta-data/nothing-here",
        "/latest/meta-data/spot/instance-action",
        "/latest/meta-data/events/recommendations/rebalance",
        "/latest/meta-data/events/maintenance/scheduled",
        "/latest/meta-data/autoscaling/target-lifecycle-state",
        "/latest/dynamic/nothing",
        "/latestx",
    ] {
        let resp = get(emu.addr(), path, &t);
        assert_eq!(resp.status, 404, "{path}");
        assert_eq!(resp.body, golden("404_response.golden"), "{path}");
    }
}

#[test]
fn malformed_request_gets_gos_400_bad_request() {
    // What AEMM's golden 400_bad_request shows: a header value with a newline (curl given
    // an HTML error page as the token) is not HTTP, and Go answers a plain 400.
    let emu = start();
    let raw = common::raw(
        emu.addr(),
        b"GET /latest/meta-data HTTP/1.1\r\nHost: x\r\nX-aws-ec2-metadata-token: <?xml\n<!DOCTYPE html>\r\n\r\n",
        Duration::from_secs(30),
    )
    .unwrap();
    let resp = common::parse(&raw);
    assert_eq!(resp.status, 400);
    assert_eq!(resp.body, golden("400_bad_request.golden"));
}

#[test]
fn listings_match_golden_files() {
    let emu = start();
    let t = token(emu.addr(), "60");
    let listing = |path: &str| {
        let resp = get(emu.addr(), path, &t);
        assert_eq!(resp.status, 200, "{path}");
        resp.body
    };
    assert_eq!(listing("/"), golden("default/index.golden"));
    assert_eq!(listing("/latest/dynamic"), golden("dynamic/index.golden"));
    assert_eq!(listing("/latest/dynamic/"), golden("dynamic/index.golden"));
    assert_eq!(
        listing("/latest/dynamic/instance-identity/"),
        golden("dynamic/instance-identity.golden")
    );
    assert_eq!(listing("/latest/dynamic/fws"), golden("dynamic/fws.golden"));
    assert_eq!(
        listing("/latest/meta-data/network/interfaces/macs/0e:49:61:0f:c3:11/"),
        golden("events/latest/meta-data/network/interfaces/macs/0e_49_61_0f_c3_11/index.golden")
    );

    // Each of AEMM's modes is one combination of the event paths.
    emu.set_target_lifecycle_state("InService");
    assert_eq!(
        listing("/latest/meta-data"),
        golden("asglifecycle/latest/meta-data/index.golden")
    );
    emu.clear_target_lifecycle_state();
    emu.set_scheduled_maintenance("[]");
    assert_eq!(
        listing("/latest/meta-data/"),
        golden("events/latest/meta-data/index.golden")
    );
    emu.clear_scheduled_maintenance();
    emu.set_spot_instance_action("terminate", "2017-09-18T08:22:00Z");
    emu.set_rebalance("2020-11-05T08:22:00Z");
    assert_eq!(
        listing("/latest/meta-data"),
        golden("spot/latest/meta-data/index.golden")
    );
    assert_eq!(
        listing("/latest/meta-data/spot"),
        golden("spot/latest/meta-data/spot.golden")
    );
    assert_eq!(
        listing("/latest/meta-data/spot/"),
        golden("spot/latest/meta-data/spot.golden")
    );
    emu.set_target_lifecycle_state("InService");
    emu.set_scheduled_maintenance("[]");
    assert_eq!(
        listing("/latest/meta-data"),
        golden("default/latest/meta-data/index.golden")
    );

    assert_eq!(listing("/latest"), b"dynamic\nmeta-data\nuser-data");
    emu.clear_user_data();
    assert_eq!(listing("/latest/"), b"dynamic\nmeta-data");
}

#[test]
fn every_default_value_is_served_at_its_path() {
    let emu = start();
    let t = token(emu.addr(), "60");
    let defaults: serde_json::Value =
        serde_json::from_str(imds_emulator::AEMM_DEFAULTS_JSON).unwrap();
    let mut checked = 0;
    for section in ["metadata", "dynamic"] {
        let paths = defaults[section]["paths"].as_object().unwrap();
        let values = &defaults[section]["values"];
        for (name, path) in paths {
            let path = path.as_str().unwrap();
            let resp = get(emu.addr(), path, &t);
            match &values[name] {
                serde_json::Value::Null => {
                    // A path without a default value (the event paths): absent.
                    assert_eq!(resp.status, 404, "{name} at {path}");
                    continue;
                }
                serde_json::Value::String(s) => {
                    assert_eq!(resp.status, 200, "{name} at {path}");
                    assert_eq!(resp.text(), *s, "{name} at {path}");
                }
                json => {
                    assert_eq!(resp.status, 200, "{name} at {path}");
                    let served: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
                    assert_eq!(served, *json, "{name} at {path}");
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 60, "only {checked} defaults checked");

    // AEMM serves JSON documents with Go's tab indent, in its struct (file) order.
    let doc = get(emu.addr(), "/latest/dynamic/instance-identity/document", &t).text();
    assert!(
        doc.starts_with("{\n\t\"accountId\": \"0123456789\",\n\t\"imageId\""),
        "{doc}"
    );
    assert!(doc.contains("\n\t\"ramdiskId\": null,\n"), "{doc}");
    assert!(doc.ends_with("\n\t\"region\": \"us-east-1\"\n}"), "{doc}");
    // ... except the elastic inference association, compact.
    let eia = get(
        emu.addr(),
        "/latest/meta-data/elastic-inference/associations/eia-bfa21c7904f64a82a21b9f4540169ce1",
        &t,
    )
    .text();
    assert!(eia.starts_with("{\"version_2018_04_12\":{"), "{eia}");
}

#[test]
fn set_and_remove_metadata_paths() {
    let emu = start();
    let t = token(emu.addr(), "60");
    emu.set("instance-type", "c5.large");
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/instance-type", &t).text(),
        "c5.large"
    );
    emu.set("/placement/region/", "eu-west-1");
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/placement/region", &t).text(),
        "eu-west-1"
    );
    emu.remove("placement");
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/placement/region", &t).status,
        404
    );
    let listing = get(emu.addr(), "/latest/meta-data", &t).text();
    assert!(!listing.contains("placement"), "{listing}");
    emu.set_dynamic("instance-identity/document", "{}");
    assert_eq!(
        get(emu.addr(), "/latest/dynamic/instance-identity/document", &t).text(),
        "{}"
    );
}

#[test]
fn tags_are_listed_and_served_until_cleared() {
    let emu = start();
    let t = token(emu.addr(), "60");
    // AEMM's default tags.
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/tags/instance", &t).text(),
        "Name\nTest"
    );
    emu.set_tag("slurm:node-name", "gpu-1");
    emu.set_tag("with space", "v");
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/tags/instance/", &t).text(),
        "Name\nTest\nslurm:node-name\nwith space"
    );
    assert_eq!(
        get(
            emu.addr(),
            "/latest/meta-data/tags/instance/slurm:node-name",
            &t
        )
        .text(),
        "gpu-1"
    );
    assert_eq!(
        get(
            emu.addr(),
            "/latest/meta-data/tags/instance/with%20space",
            &t
        )
        .text(),
        "v"
    );
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/tags/instance/Name", &t).text(),
        "test-instance"
    );
    emu.clear_tags();
    let resp = get(emu.addr(), "/latest/meta-data/tags/instance/", &t);
    assert_eq!(resp.status, 404);
    assert_eq!(resp.body, golden("404_response.golden"));
    let listing = get(emu.addr(), "/latest/meta-data", &t).text();
    assert!(!listing.contains("tags/"), "{listing}");
    emu.set_tag("only", "one");
    assert_eq!(
        get(emu.addr(), "/latest/meta-data/tags/instance", &t).text(),
        "only"
    );
}

#[test]
fn user_data_is_served_raw_until_cleared() {
    let emu = start();
    let t = token(emu.addr(), "60");
    let resp = get(emu.addr(), "/latest/user-data", &t);
    assert_eq!(resp.status, 200);
    assert_eq!(resp.body, b"1234,john,reboot,true\n");
    let data =
        b"Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\n\xff\x00--b--\r\n".to_vec();
    emu.set_user_data(data.clone());
    let resp = get(emu.addr(), "/latest/user-data", &t);
    assert_eq!(resp.body, data);
    assert_eq!(
        resp.header("content-type"),
        Some("application/octet-stream")
    );
    emu.clear_user_data();
    let resp = get(emu.addr(), "/latest/user-data", &t);
    assert_eq!(resp.status, 404);
    assert_eq!(resp.body, golden("404_response.golden"));
}

#[test]
fn event_paths_are_settable_and_clearable() {
    let emu = start();
    let t = token(emu.addr(), "60");
    let at = |p: &str| get(emu.addr(), &format!("/latest/meta-data/{p}"), &t);

    emu.set_spot_instance_action("hibernate", "2017-09-18T08:22:00Z");
    let ia: serde_json::Value = serde_json::from_slice(&at("spot/instance-action").body).unwrap();
    assert_eq!(
        ia,
        serde_json::json!({"action": "hibernate", "time": "2017-09-18T08:22:00Z"})
    );
    assert_eq!(
        at("spot/instance-action/").text(),
        r#"{"action": "hibernate", "time": "2017-09-18T08:22:00Z"}"#
    );
    assert_eq!(at("spot/termination-time").text(), "2017-09-18T08:22:00Z");
    emu.clear_spot_instance_action();
    assert_eq!(at("spot/instance-action").status, 404);
    assert_eq!(at("spot/termination-time").status, 404);
    assert_eq!(at("spot").status, 404);

    emu.set_rebalance("2020-11-05T08:22:00Z");
    assert_eq!(
        at("events/recommendations/rebalance").text(),
        r#"{"noticeTime": "2020-11-05T08:22:00Z"}"#
    );
    assert_eq!(at("events/recommendations").text(), "rebalance");
    emu.clear_rebalance();
    assert_eq!(at("events/recommendations/rebalance").status, 404);
    assert_eq!(at("events").status, 404);

    let events = r#"[{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot", "Description": "scheduled reboot", "EventId": "instance-event-1234567890abcdef0", "NotAfter": "21 Jan 2019 09:17:23 GMT", "State": "active"}]"#;
    emu.set_scheduled_maintenance(events);
    assert_eq!(at("events/maintenance/scheduled").text(), events);
    assert_eq!(at("events/maintenance").text(), "scheduled");
    // EC2 moves a completed or canceled event to `history`.
    emu.finish_maintenance_event("instance-event-1234567890abcdef0", EventOutcome::Completed)
        .unwrap();
    assert_eq!(at("events/maintenance/scheduled").status, 404);
    assert_eq!(at("events/maintenance").text(), "history");
    let history: serde_json::Value =
        serde_json::from_str(&at("events/maintenance/history").text()).unwrap();
    assert_eq!(history[0]["State"], "completed");
    assert_eq!(history[0]["Description"], "[Completed] scheduled reboot");
    assert!(emu
        .finish_maintenance_event("instance-event-1234567890abcdef0", EventOutcome::Canceled)
        .is_err());
    emu.clear_maintenance_history();
    assert_eq!(at("events/maintenance/history").status, 404);
    emu.set_maintenance_history("[]");
    assert_eq!(at("events/maintenance/history").text(), "[]");
    emu.clear_maintenance_history();
    emu.set_scheduled_maintenance(events);
    emu.clear_scheduled_maintenance();
    assert_eq!(at("events/maintenance/scheduled").status, 404);

    emu.set_target_lifecycle_state("Terminated");
    assert_eq!(
        at("autoscaling/target-lifecycle-state").text(),
        "Terminated"
    );
    emu.clear_target_lifecycle_state();
    assert_eq!(at("autoscaling/target-lifecycle-state").status, 404);
}

#[test]
fn requests_are_counted_and_logged() {
    let emu = start();
    assert_eq!(emu.request_count(), 0);
    let t = token(emu.addr(), "60");
    get(emu.addr(), "/latest/meta-data/mac", &t);
    get(emu.addr(), "/latest/meta-data/absent", &t);
    request(emu.addr(), "GET", "/latest/meta-data/mac", &[], b"");
    assert_eq!(emu.request_count(), 4);
    let rec = |m: &str, p: &str, s: u16| RequestRecord {
        method: m.into(),
        path: p.into(),
        status: Some(s),
    };
    assert_eq!(
        emu.requests(),
        vec![
            rec("PUT", "/latest/api/token", 200),
            rec("GET", "/latest/meta-data/mac", 200),
            rec("GET", "/latest/meta-data/absent", 404),
            rec("GET", "/latest/meta-data/mac", 401),
        ]
    );
}

#[test]
fn keep_alive_connections_serve_several_requests() {
    use std::io::{Read, Write};
    let emu = start();
    let t = token(emu.addr(), "60");
    let mut s = std::net::TcpStream::connect(emu.addr()).unwrap();
    let req = format!(
        "GET /latest/meta-data/ami-id HTTP/1.1\r\nHost: x\r\nX-aws-ec2-metadata-token: {t}\r\n\r\n\
         GET /latest/meta-data/mac HTTP/1.1\r\nHost: x\r\nX-aws-ec2-metadata-token: {t}\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
    assert!(out.contains("ami-0a887e401f7654935") && out.ends_with("0e:49:61:0f:c3:11"));
}

#[test]
fn shutdown_closes_the_port() {
    let emu = start();
    let addr = emu.addr();
    token(addr, "60");
    emu.shutdown();
    assert!(std::net::TcpStream::connect(addr).is_err());
}

/// The copies under `tests/golden/` and `data/` must stay identical to the reference
/// (checked when the shared reference folder is present next to the repository).
#[test]
fn golden_copies_match_the_shared_reference() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let reference = manifest.join("../../shared/reference");
    if !reference.exists() {
        eprintln!("{} not present: copies not compared", reference.display());
        return;
    }
    let ours = std::fs::read(manifest.join("data/aemm-metadata-default-values.json")).unwrap();
    let theirs = std::fs::read(reference.join("aemm-metadata-default-values.json")).unwrap();
    assert!(
        ours == theirs,
        "data/aemm-metadata-default-values.json differs"
    );
    let mut compared = 0;
    let mut stack = vec![reference.join("aemm-golden")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(reference.join("aemm-golden")).unwrap();
            let copy = common::golden_dir().join(rel);
            let ours = std::fs::read(&copy)
                .unwrap_or_else(|e| panic!("{}: {e} (copy it from the reference)", copy.display()));
            assert!(
                ours == std::fs::read(&path).unwrap(),
                "{} differs",
                rel.display()
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 14);
}
