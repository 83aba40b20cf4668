use super::*;
use crate::detect::Status;

fn at(text: &str) -> Timestamp {
    text.parse().expect("a time")
}

fn scheduled(code: &str, id: &str, not_before: &str) -> Scheduled {
    Scheduled {
        id: id.into(),
        code: code.into(),
        not_before: at(not_before),
        not_after: None,
    }
}

#[test]
fn the_services_replies_are_read_as_aws_writes_them() {
    let spot = parse_spot(br#"{"action": "terminate", "time": "2026-11-29T08:22:00Z"}"#);
    assert_eq!(
        spot,
        Ok(Spot {
            action: "terminate".into(),
            at: at("2026-11-29T08:22:00Z")
        })
    );
    let events = parse_scheduled(
        br#"[
          {"NotBefore": "2 Dec 2026 09:00:43 GMT", "Code": "system-reboot", "Description": "scheduled reboot",
           "EventId": "instance-event-0d59937288b749b32", "NotAfter": "2 Dec 2026 09:17:23 GMT", "State": "active"},
          {"NotBefore": "21 Nov 2026 09:00:00 GMT", "Code": "instance-stop", "Description": "[Completed] stop",
           "EventId": "instance-event-1111111111aaaaaaa", "State": "completed"},
          {"NotBefore": "1 Dec 2026 10:00:00 GMT", "Code": "system-maintenance", "Description": "power",
           "EventId": "instance-event-2222222222bbbbbbb", "NotAfter": "", "State": "active"}
        ]"#,
    )
    .expect("events");
    assert_eq!(
        events,
        vec![
            scheduled(
                "system-maintenance",
                "instance-event-2222222222bbbbbbb",
                "2026-12-01T10:00:00Z"
            ),
            Scheduled {
                not_after: Some(at("2026-12-02T09:17:23Z")),
                ..scheduled(
                    "system-reboot",
                    "instance-event-0d59937288b749b32",
                    "2026-12-02T09:00:43Z"
                )
            },
        ],
        "active ones only, soonest first"
    );
    assert_eq!(
        parse_rebalance(br#"{"noticeTime": "2026-11-29T08:17:00Z"}"#),
        Ok(at("2026-11-29T08:17:00Z"))
    );
}

#[test]
fn what_is_not_a_notice_is_refused_with_the_field() {
    let wrong_time =
        parse_spot(br#"{"action": "terminate", "time": "soon"}"#).expect_err("refused");
    assert!(
        wrong_time.contains("time \"soon\" is not an RFC 3339 time"),
        "{wrong_time}"
    );
    let html = parse_spot(b"<html>captive portal</html>").expect_err("refused");
    assert!(html.starts_with("not the JSON of a notice"), "{html}");
    let odd_action = parse_spot(br#"{"action": "<script>", "time": "2026-11-29T08:22:00Z"}"#)
        .expect_err("refused");
    assert!(
        odd_action.contains("action \"<script>\" is not a plain name"),
        "{odd_action}"
    );
    let huge = format!(r#"{{"noticeTime": "{}"}}"#, "9".repeat(REPLY_LIMIT));
    let huge = parse_rebalance(huge.as_bytes()).expect_err("refused");
    assert!(
        huge.contains("more than the 65536 a notice may have"),
        "{huge}"
    );
    let many = format!(
        "[{}]",
        vec![r#"{"Code":"system-reboot","EventId":"e","State":"active","NotBefore":"2 Dec 2026 09:00:43 GMT"}"#; EVENTS_LIMIT + 1].join(",")
    );
    assert!(
        parse_scheduled(many.as_bytes())
            .expect_err("refused")
            .contains("33 events")
    );
    let bad_date = parse_scheduled(
        br#"[{"Code":"system-reboot","EventId":"e","State":"active","NotBefore":"2026-12-02"}]"#,
    )
    .expect_err("refused");
    assert!(
        bad_date.starts_with("event 0: NotBefore \"2026-12-02\" is not a time like"),
        "{bad_date}"
    );
}

#[test]
fn the_finding_names_every_notice_and_the_most_urgent_reason() {
    let none = evaluate(&Notices::default());
    none.assert_is(Status::Ok, "NoNotice");
    let all = Notices {
        spot: Some(Spot {
            action: "stop".into(),
            at: at("2026-11-29T08:22:00Z"),
        }),
        scheduled: vec![scheduled(
            "system-reboot",
            "instance-event-0d5",
            "2026-12-02T09:00:43Z",
        )],
        rebalance: Some(at("2026-11-29T08:17:00Z")),
    };
    let found = evaluate(&all);
    found.assert_is(Status::Problem, "SpotInterruption");
    assert_eq!(
        found.message,
        "spot interruption: the instance is stopped at 2026-11-29T08:22:00Z; scheduled event system-reboot (instance-event-0d5) between 2026-12-02T09:00:43Z; rebalance recommended at 2026-11-29T08:17:00Z"
    );
    let maintenance_only = Notices {
        scheduled: vec![scheduled("system-maintenance", "e", "2026-12-02T09:00:43Z")],
        ..Notices::default()
    };
    evaluate(&maintenance_only).assert_is(Status::Problem, "ScheduledMaintenance");
    let rebalance = Notices {
        rebalance: all.rebalance,
        ..Notices::default()
    };
    evaluate(&rebalance).assert_is(Status::Problem, "RebalanceRecommended");
}

#[test]
fn a_spot_notice_is_due_at_once_and_an_event_once_it_is_drain_ahead_away() {
    let now = at("2026-11-29T08:00:00Z");
    let hour = Duration::from_secs(3600);
    let boot = "3F2A9C1E-77aa-4c0b";
    assert_eq!(due(&Notices::default(), now, hour, boot), None);
    let spot = Notices {
        spot: Some(Spot {
            action: "terminate".into(),
            at: at("2026-11-29T08:02:00Z"),
        }),
        ..Notices::default()
    };
    let drained = due(&spot, now, hour, boot).expect("due");
    assert_eq!(
        (drained.key.as_str(), drained.reason, drained.deadline),
        (
            "3f2a9c1e",
            MaintenanceReason::Shutdown,
            at("2026-11-29T08:02:00Z")
        )
    );
    let later = |code: &str, minutes: i64| Notices {
        scheduled: vec![scheduled(
            code,
            "instance-event-0d59937288b749b32",
            &now.checked_add(jiff::SignedDuration::from_mins(minutes))
                .expect("time")
                .to_string(),
        )],
        ..Notices::default()
    };
    assert_eq!(
        due(&later("system-reboot", 61), now, hour, boot),
        None,
        "not yet"
    );
    let reboot = due(&later("system-reboot", 59), now, hour, boot).expect("due");
    assert_eq!(
        (reboot.key.as_str(), reboot.reason),
        ("8b749b32", MaintenanceReason::Reboot)
    );
    let stop = due(&later("instance-retirement", 0), now, hour, boot).expect("due");
    assert_eq!(stop.reason, MaintenanceReason::Shutdown);
    assert_eq!(
        due(&later("system-maintenance", 0), now, hour, boot),
        None,
        "the instance stays up"
    );
    assert!(
        due(&later("instance-stop", -30), now, hour, boot).is_some(),
        "under way"
    );
}
