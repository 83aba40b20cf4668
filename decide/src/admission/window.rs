//! Maintenance windows: when disruptions may start. A window is either days + start + end in
//! a time zone (crossing midnight when end is before start; `days` are the days it opens), or a
//! cron expression for when it opens plus how long it stays open. Evaluated on civil time in
//! the window's zone, so daylight-saving changes move it with the local clock.

use std::str::FromStr;

use croner::Cron;
use jiff::{
    Timestamp, Zoned,
    civil::{Time, Weekday},
    tz::TimeZone,
};
use nodeward_api::{
    MaintenanceWindow,
    policy::{Blackout, Weekday as ApiWeekday},
};

/// A window ready to evaluate.
#[derive(Clone, Debug)]
pub struct Window {
    zone: TimeZone,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Daily {
        days: Vec<Weekday>,
        start: Time,
        end: Time,
    },
    Cron {
        cron: Box<Cron>,
        open_for: jiff::SignedDuration,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("windows[{index}].{field}: {message}")]
pub struct InvalidWindow {
    pub index: usize,
    pub field: &'static str,
    pub message: String,
}

impl Window {
    /// Reads the API form; `index` names the window in errors.
    pub fn parse(index: usize, window: &MaintenanceWindow) -> Result<Self, InvalidWindow> {
        let invalid = |field: &'static str, message: String| InvalidWindow {
            index,
            field,
            message,
        };
        let zone_name = window.time_zone.as_deref().unwrap_or("UTC");
        let zone = TimeZone::get(zone_name).map_err(|e| {
            invalid(
                "timeZone",
                format!("{zone_name:?} is not an IANA time zone: {e}"),
            )
        })?;
        let time = |field: &'static str, value: &Option<String>| {
            let text = value
                .as_deref()
                .ok_or_else(|| invalid(field, "missing".into()))?;
            Time::strptime("%H:%M", text)
                .map_err(|e| invalid(field, format!("{text:?} is not HH:MM: {e}")))
        };
        let kind = match (&window.cron, &window.duration) {
            (Some(expression), Some(duration)) => {
                let cron = Cron::from_str(expression)
                    .map_err(|e| invalid("cron", format!("{expression:?}: {e}")))?;
                let open_for = duration
                    .to_std()
                    .map_err(|e| invalid("duration", e.to_string()))?;
                Kind::Cron {
                    cron: Box::new(cron),
                    open_for: jiff::SignedDuration::try_from(open_for)
                        .map_err(|e| invalid("duration", e.to_string()))?,
                }
            }
            (Some(_), None) => {
                return Err(invalid("duration", "a cron window needs a duration".into()));
            }
            (None, _) => Kind::Daily {
                days: window.days.iter().map(|d| weekday(*d)).collect(),
                start: time("start", &window.start)?,
                end: time("end", &window.end)?,
            },
        };
        Ok(Self { zone, kind })
    }

    /// Whether the window is open at `now`.
    pub fn is_open(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.zone.clone());
        match &self.kind {
            Kind::Daily { days, start, end } => {
                let opens_on = |day: Weekday| days.is_empty() || days.contains(&day);
                let at = local.time();
                let today = local.weekday();
                if start < end {
                    opens_on(today) && at >= *start && at < *end
                } else {
                    // Crosses midnight: open from `start` on an opening day, or before `end`
                    // on the day after one.
                    (opens_on(today) && at >= *start) || (opens_on(today.previous()) && at < *end)
                }
            }
            Kind::Cron { cron, open_for } => match cron.find_previous_occurrence(&local, true) {
                Ok(opened) => local.duration_since(&opened) < *open_for,
                Err(_) => false,
            },
        }
    }
}

impl Window {
    /// When it opens next after `now` (within a week and a day for a daily window; `None` when
    /// a cron expression names no later time).
    pub fn next_opening(&self, now: Timestamp) -> Option<Timestamp> {
        let local = now.to_zoned(self.zone.clone());
        match &self.kind {
            Kind::Daily { days, start, .. } => (0..=7).find_map(|ahead| {
                let date = local
                    .date()
                    .checked_add(jiff::Span::new().days(ahead))
                    .ok()?;
                let opens = days.is_empty() || days.contains(&date.weekday());
                let at = date.to_datetime(*start).to_zoned(self.zone.clone()).ok()?;
                (opens && at.timestamp() > now).then(|| at.timestamp())
            }),
            Kind::Cron { cron, .. } => cron
                .find_next_occurrence(&local, false)
                .ok()
                .map(|z| z.timestamp()),
        }
    }
}

/// When the first of `windows` opens next after `now`.
pub fn next_opening(windows: &[Window], now: Timestamp) -> Option<Timestamp> {
    windows.iter().filter_map(|w| w.next_opening(now)).min()
}

/// Whether disruptions may start now: no windows means any time, else any window open.
pub fn any_open(windows: &[Window], now: Timestamp) -> bool {
    windows.is_empty() || windows.iter().any(|w| w.is_open(now))
}

/// Why nothing may start at `now`, if one of `blackouts` holds it (the one ending last, when
/// several overlap): its reason and when it ends.
pub fn in_blackout(blackouts: &[Blackout], now: Timestamp) -> Option<String> {
    let holding = blackouts
        .iter()
        .filter(|b| b.start.0 <= now && now < b.end.0)
        .max_by_key(|b| b.end.0)?;
    let reason = holding
        .reason
        .as_deref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    Some(format!("in a blackout{reason} until {}", holding.end.0))
}

fn weekday(day: ApiWeekday) -> Weekday {
    match day {
        ApiWeekday::Mon => Weekday::Monday,
        ApiWeekday::Tue => Weekday::Tuesday,
        ApiWeekday::Wed => Weekday::Wednesday,
        ApiWeekday::Thu => Weekday::Thursday,
        ApiWeekday::Fri => Weekday::Friday,
        ApiWeekday::Sat => Weekday::Saturday,
        ApiWeekday::Sun => Weekday::Sunday,
    }
}

/// A local time in a zone, for tests and for callers that think in wall-clock time.
pub fn at(zone: &str, civil: &str) -> Result<Timestamp, jiff::Error> {
    let zoned: Zoned = jiff::civil::DateTime::from_str(civil)?.in_tz(zone)?;
    Ok(zoned.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(json: serde_json::Value) -> Window {
        let api: MaintenanceWindow = serde_json::from_value(json).expect("window");
        Window::parse(0, &api).expect("valid window")
    }

    fn open(w: &Window, zone: &str, civil: &str) -> bool {
        w.is_open(at(zone, civil).expect("time"))
    }

    #[test]
    fn a_daytime_window_on_weekdays() {
        let w = window(
            serde_json::json!({"days": ["Mon", "Tue"], "start": "09:00", "end": "17:00", "timeZone": "Europe/Berlin"}),
        );
        // 2026-11-23 is a Monday.
        assert!(open(&w, "Europe/Berlin", "2026-11-23T09:00"));
        assert!(open(&w, "Europe/Berlin", "2026-11-23T16:59"));
        assert!(
            !open(&w, "Europe/Berlin", "2026-11-23T17:00"),
            "end is exclusive"
        );
        assert!(!open(&w, "Europe/Berlin", "2026-11-25T10:00"), "Wednesday");
        // The same instant seen from UTC: 08:30 UTC is 09:30 in Berlin (CET).
        assert!(open(&w, "UTC", "2026-11-23T08:30"));
    }

    #[test]
    fn the_next_opening_is_the_first_opening_day_after_now_in_the_windows_zone() {
        let weekdays = window(
            serde_json::json!({"days": ["Mon", "Tue"], "start": "09:00", "end": "17:00", "timeZone": "Europe/Berlin"}),
        );
        let time = |zone: &str, civil: &str| at(zone, civil).expect("time");
        // Wednesday 2026-11-25 noon: next Monday 09:00 in Berlin.
        assert_eq!(
            weekdays.next_opening(time("Europe/Berlin", "2026-11-25T12:00")),
            Some(time("Europe/Berlin", "2026-11-30T09:00"))
        );
        // Monday before 09:00: the same day.
        assert_eq!(
            weekdays.next_opening(time("Europe/Berlin", "2026-11-23T08:00")),
            Some(time("Europe/Berlin", "2026-11-23T09:00"))
        );
        let nightly = window(serde_json::json!({"cron": "0 2 * * *", "duration": "1h"}));
        assert_eq!(
            next_opening(
                &[weekdays, nightly],
                time("Europe/Berlin", "2026-11-25T12:00")
            ),
            Some(time("UTC", "2026-11-26T02:00")),
            "the first of the windows"
        );
    }

    #[test]
    fn a_window_crossing_midnight_belongs_to_the_day_it_opens() {
        let w = window(serde_json::json!({"days": ["Sat"], "start": "22:00", "end": "06:00"}));
        // 2026-11-21 is a Saturday.
        assert!(open(&w, "UTC", "2026-11-21T23:30"));
        assert!(
            open(&w, "UTC", "2026-11-22T05:59"),
            "early Sunday is still Saturday's window"
        );
        assert!(!open(&w, "UTC", "2026-11-22T06:00"));
        assert!(
            !open(&w, "UTC", "2026-11-22T23:00"),
            "Sunday evening does not open"
        );
        assert!(
            !open(&w, "UTC", "2026-11-21T05:00"),
            "early Saturday belongs to Friday, which does not open"
        );
    }

    #[test]
    fn no_days_means_every_day() {
        let w = window(
            serde_json::json!({"start": "01:00", "end": "03:00", "timeZone": "America/New_York"}),
        );
        assert!(open(&w, "America/New_York", "2026-11-24T02:00"));
        assert!(!open(&w, "America/New_York", "2026-11-24T04:00"));
    }

    #[test]
    fn windows_follow_the_local_clock_across_daylight_saving() {
        let w = window(
            serde_json::json!({"start": "02:30", "end": "04:00", "timeZone": "Europe/Berlin"}),
        );
        // Summer (CEST, UTC+2) and winter (CET, UTC+1): the same local window, other UTC times.
        assert!(w.is_open(at("UTC", "2026-07-01T00:45").expect("t")));
        assert!(w.is_open(at("UTC", "2026-12-01T01:45").expect("t")));
        assert!(!w.is_open(at("UTC", "2026-12-01T00:45").expect("t")));
    }

    #[test]
    fn a_cron_window_is_open_for_its_duration_after_each_start() {
        let w = window(
            serde_json::json!({"cron": "0 2 * * 6", "duration": "3h", "timeZone": "Asia/Tokyo"}),
        );
        assert!(
            open(&w, "Asia/Tokyo", "2026-11-21T02:00"),
            "Saturday 02:00 opens it"
        );
        assert!(open(&w, "Asia/Tokyo", "2026-11-21T04:59"));
        assert!(!open(&w, "Asia/Tokyo", "2026-11-21T05:00"));
        assert!(
            !open(&w, "Asia/Tokyo", "2026-11-22T02:30"),
            "Sunday is not in the cron"
        );
    }

    #[test]
    fn no_windows_means_always_and_any_open_window_suffices() {
        let now = at("UTC", "2026-11-21T12:00").expect("t");
        assert!(any_open(&[], now));
        let closed = window(serde_json::json!({"start": "01:00", "end": "02:00"}));
        let opened = window(serde_json::json!({"start": "11:00", "end": "13:00"}));
        assert!(!any_open(std::slice::from_ref(&closed), now));
        assert!(any_open(&[closed, opened], now));
    }

    #[test]
    fn bad_windows_name_the_field() {
        let parse = |json: serde_json::Value| {
            let api: MaintenanceWindow = serde_json::from_value(json).expect("window");
            Window::parse(2, &api).expect_err("invalid")
        };
        let e = parse(
            serde_json::json!({"start": "22:00", "end": "06:00", "timeZone": "Mars/Olympus"}),
        );
        assert_eq!((e.index, e.field), (2, "timeZone"));
        let e = parse(serde_json::json!({"cron": "61 * * * *", "duration": "1h"}));
        assert_eq!(e.field, "cron");
        assert!(e.to_string().starts_with("windows[2].cron: "), "{e}");
        let e = parse(serde_json::json!({"start": "22:00"}));
        assert_eq!(e.field, "end");
    }

    #[test]
    fn a_blackout_holds_from_its_start_until_its_end_and_says_why() {
        let at = |s: &str| s.parse::<Timestamp>().expect("timestamp");
        let blackout = |start: &str, end: &str, reason: Option<&str>| Blackout {
            start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(start)),
            end: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(end)),
            reason: reason.map(str::to_owned),
        };
        let freezes = [
            blackout(
                "2026-12-20T00:00:00+01:00",
                "2027-01-04T00:00:00+01:00",
                Some("year-end freeze"),
            ),
            blackout("2027-01-02T00:00:00Z", "2027-01-10T00:00:00Z", None),
        ];
        assert_eq!(in_blackout(&freezes, at("2026-12-19T22:59:59Z")), None);
        assert_eq!(
            in_blackout(&freezes, at("2026-12-19T23:00:00Z")).as_deref(),
            Some("in a blackout (year-end freeze) until 2027-01-03T23:00:00Z")
        );
        // Overlapping: the one that holds longest is said.
        assert_eq!(
            in_blackout(&freezes, at("2027-01-03T00:00:00Z")).as_deref(),
            Some("in a blackout until 2027-01-10T00:00:00Z")
        );
        assert_eq!(
            in_blackout(&freezes, at("2027-01-10T00:00:00Z")),
            None,
            "over at its end"
        );
    }
}
