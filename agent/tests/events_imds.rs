//! IMDS notice polling against the IMDS emulator (a real HTTP server with IMDSv2 tokens and
//! fault injection): both time formats, empty fields, unknown codes and actions, malformed
//! and truncated bodies, past times, and 401/503 in the middle of an interruption.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use imds_emulator::{Config, Emulator, Fault, FaultTarget};
use slurm_node_agent::drain::Cause;
use slurm_node_agent::events::{self, notice, Decision, EventsSettings, Observations, Observed};
use slurm_node_agent::imds::{Imds, ImdsSettings};
use slurm_node_agent::section::HumanDuration;

fn client(emu: &Emulator) -> Imds {
    Imds::new(&ImdsSettings {
        endpoint: emu.endpoint(),
        timeout: HumanDuration(Duration::from_millis(500)),
        attempts: 4,
        ..ImdsSettings::default()
    })
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn spot_notice_absent_present_unknown_action_and_past_time() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu);
    rt().block_on(async {
        assert_eq!(events::poll_spot(&imds).await.unwrap(), Observed::Absent);
        emu.set_spot_instance_action("terminate", "2017-09-18T08:22:00Z");
        let Observed::Present(n) = events::poll_spot(&imds).await.unwrap() else {
            panic!("no notice")
        };
        assert_eq!(n.action, notice::SpotAction::Terminate);
        assert_eq!(n.time, 1_505_722_920);
        // The time is long past: still a drain, with that deadline.
        let obs = Observations {
            spot: Some(Observed::Present(n)),
            ..Default::default()
        };
        let d = events::decide(
            &EventsSettings::default(),
            &obs,
            None,
            slurm_node_agent::time::now(),
        );
        assert_eq!(
            d,
            [Decision::Drain(Cause::Spot {
                action: "terminate".into(),
                time: 1_505_722_920
            })]
        );
        emu.set_spot_instance_action("reboot-ish", "2017-09-18T08:22:00Z");
        let Observed::Present(n) = events::poll_spot(&imds).await.unwrap() else {
            panic!("no notice")
        };
        assert_eq!(n.action, notice::SpotAction::Other("reboot-ish".into()));
    });
}

#[test]
fn malformed_and_truncated_bodies_are_unreadable_and_name_the_path() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu);
    rt().block_on(async {
        for body in [
            "{\"action\": \"terminate\", \"time\": \"2017-09-18T08:2",
            "{\"action\": \"terminate\", \"time\": \"\"}",
            "not json",
            "{}",
        ] {
            emu.set("spot/instance-action", body);
            match events::poll_spot(&imds).await.unwrap() {
                Observed::Unreadable(e) => {
                    assert!(e.to_string().contains("spot/instance-action"), "{e}")
                }
                other => panic!("{body:?}: {other:?}"),
            }
        }
        emu.set_scheduled_maintenance("[{\"NotBefore\": \"21 Jan 2019 09:00:43 GMT\", \"Code\"");
        assert!(matches!(
            events::poll_maintenance(&imds).await.unwrap(),
            Observed::Unreadable(_)
        ));
        emu.set("events/recommendations/rebalance", "{\"noticeTime\": 17}");
        assert!(matches!(
            events::poll_rebalance(&imds).await.unwrap(),
            Observed::Unreadable(_)
        ));
    });
}

#[test]
fn maintenance_both_formats_empty_not_after_unknown_code_and_cancel() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu);
    let now = slurm_node_agent::time::now();
    let soon = slurm_node_agent::time::format(now + 3600);
    rt().block_on(async {
        assert_eq!(
            events::poll_maintenance(&imds).await.unwrap(),
            Observed::Absent
        );
        emu.set_scheduled_maintenance(&format!(
            r#"[{{"NotBefore": "21 Jan 2019 09:00:43 GMT", "Code": "system-reboot",
                 "Description": "old", "EventId": "instance-event-old", "NotAfter": "",
                 "State": "completed"}},
                {{"NotBefore": "{soon}", "Code": "brand-new-code", "Description": "",
                 "EventId": "instance-event-soon", "NotAfter": "", "State": "active"}},
                {{"NotBefore": "1 Jan 2099 00:00:00 GMT", "Code": "instance-retirement",
                 "Description": "", "EventId": "instance-event-far", "NotAfter": "",
                 "State": "active"}}]"#
        ));
        let obs = Observations {
            maintenance: Some(events::poll_maintenance(&imds).await.unwrap()),
            ..Default::default()
        };
        let d = events::decide(&EventsSettings::default(), &obs, None, now);
        // A completed reboot event ends its drain once slurmd has registered again.
        assert_eq!(
            d,
            [
                Decision::UndoAfterRegistration("maintenance:instance-event-old".into()),
                Decision::Drain(Cause::Maintenance {
                    event_id: "instance-event-soon".into(),
                    code: "brand-new-code".into(),
                    not_before: Some(now + 3600),
                }),
            ]
        );
        // With a 30 min lead the event an hour away is not due yet.
        let mut s = EventsSettings::default();
        s.maintenance_lead = HumanDuration(Duration::from_secs(1800));
        assert_eq!(events::decide(&s, &obs, None, now).len(), 1);
    });
}

#[test]
fn imds_401_and_503_in_the_middle_of_an_interruption() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu);
    emu.set_spot_instance_action("terminate", "2017-09-18T08:22:00Z");
    rt().block_on(async {
        assert!(matches!(
            events::poll_spot(&imds).await.unwrap(),
            Observed::Present(_)
        ));
        // The service forgets every token: the client gets a new one and still reads it.
        emu.expire_tokens();
        assert!(matches!(
            events::poll_spot(&imds).await.unwrap(),
            Observed::Present(_)
        ));
        // Three 503s: retried within one poll.
        emu.inject(Fault::status(503).on(FaultTarget::Get).times(3));
        assert!(matches!(
            events::poll_spot(&imds).await.unwrap(),
            Observed::Present(_)
        ));
        // 503 until cleared: the poll fails (never "absent"), and a failed poll decides
        // nothing, so nothing is undone.
        emu.inject(Fault::status(503).on(FaultTarget::Get));
        let e = events::poll_spot(&imds).await.unwrap_err();
        assert_eq!(e.status(), Some(503));
        assert!(e.to_string().contains("spot/instance-action"), "{e}");
        let current = Cause::Maintenance {
            event_id: "e".into(),
            code: "system-reboot".into(),
            not_before: None,
        };
        let none = events::decide(
            &EventsSettings::default(),
            &Observations::default(),
            Some(&current),
            0,
        );
        assert!(none.is_empty());
        // 401 on every GET even with a fresh token.
        emu.clear_faults();
        emu.inject(Fault::status(401).on(FaultTarget::Get));
        let e = events::poll_spot(&imds).await.unwrap_err();
        assert_eq!(e.status(), Some(401));
        emu.clear_faults();
        assert!(matches!(
            events::poll_spot(&imds).await.unwrap(),
            Observed::Present(_)
        ));
    });
}

#[test]
fn lifecycle_terminated_and_unknown_states() {
    let emu = Emulator::start(Config::default()).unwrap();
    let imds = client(&emu);
    rt().block_on(async {
        emu.set_target_lifecycle_state("InService");
        let obs = Observations {
            lifecycle: Some(events::poll_lifecycle(&imds).await.unwrap()),
            ..Default::default()
        };
        assert!(events::decide(&EventsSettings::default(), &obs, None, 0).is_empty());
        emu.set_target_lifecycle_state("Terminated");
        let obs = Observations {
            lifecycle: Some(events::poll_lifecycle(&imds).await.unwrap()),
            ..Default::default()
        };
        assert_eq!(
            events::decide(&EventsSettings::default(), &obs, None, 0),
            [Decision::Drain(Cause::Lifecycle {
                state: "Terminated".into(),
                seen: 0,
            })]
        );
        emu.set_target_lifecycle_state("Exploded");
        let obs = Observations {
            lifecycle: Some(events::poll_lifecycle(&imds).await.unwrap()),
            ..Default::default()
        };
        assert!(events::decide(&EventsSettings::default(), &obs, None, 0).is_empty());
    });
}
