use std::path::PathBuf;

use super::*;
use crate::error::ErrorKind;

/// A tracer whose traces go to a channel the test reads.
fn tracer(settings: Settings) -> (Tracer, crossbeam_channel::Receiver<record::Finished>) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let config = TraceConfig { settings, file: Some(PathBuf::from("/tmp/t.json")), ..TraceConfig::default() };
    (Tracer::with_sink(config, Sink::File(tx, Default::default())), rx)
}

fn update(pairs: &[(&str, Option<&str>)]) -> Update {
    Update::parse(pairs.iter().map(|(k, v)| (k.to_string(), v.map(|v| vec![v.to_string()])))).expect("valid")
}

fn sampled(t: &Tracer, key: &str, n: usize) -> Vec<bool> {
    (0..n).map(|_| t.sample(key, key, 1, || None).is_on()).collect()
}

fn listed(t: &Tracer, model: Option<&str>, key: &str) -> Vec<String> {
    t.listed(model).into_iter().find(|(k, _)| *k == key).map(|(_, v)| v).unwrap_or_default()
}

#[test]
fn off_by_default_and_nothing_is_sampled() {
    let (t, _rx) = tracer(Settings::default());
    assert!(!t.armed());
    assert_eq!(sampled(&t, "m", 3000), vec![false; 3000]);
}

#[test]
fn every_rate_th_request_is_traced_until_the_count_runs_out() {
    let (t, rx) = tracer(Settings::default());
    t.update(
        None,
        &update(&[("trace_level", Some("TIMESTAMPS")), ("trace_rate", Some("3")), ("trace_count", Some("2"))]),
    )
    .expect("valid");
    assert!(t.armed());
    let got = sampled(&t, "m", 10);
    assert_eq!(got, [false, false, true, false, false, true, false, false, false, false]);
    assert_eq!(listed(&t, None, "trace_count"), ["0"]);
    // Each trace reached the sink when its last holder let go, numbered from 1.
    let ids: Vec<u64> = rx.try_iter().map(|f| f.id).collect();
    assert_eq!(ids, [1, 2]);
}

#[test]
fn a_models_settings_override_key_by_key_and_null_falls_back() {
    let (t, _rx) = tracer(Settings::default());
    t.update(Some("a"), &update(&[("trace_level", Some("TIMESTAMPS")), ("trace_rate", Some("1"))])).expect("valid");
    assert!(t.armed());
    assert_eq!(sampled(&t, "a", 2), [true, true]);
    assert_eq!(sampled(&t, "b", 2), [false, false], "other models follow the global OFF");
    t.update(None, &update(&[("trace_count", Some("20"))])).expect("valid");
    assert_eq!(listed(&t, Some("a"), "trace_count"), ["20"], "unset keys follow the global ones");
    assert_eq!(listed(&t, Some("a"), "trace_rate"), ["1"]);
    t.update(Some("a"), &update(&[("trace_level", None), ("trace_rate", None)])).expect("valid");
    assert!(!t.armed(), "no scope is on any more");
    assert_eq!(listed(&t, Some("a"), "trace_rate"), ["1000"]);
}

#[test]
fn a_refused_change_applies_nothing() {
    let (t, _rx) = tracer(Settings::default());
    let e = t.update(None, &update(&[("trace_level", Some("TIMESTAMPS")), ("trace_rate", Some("0"))]));
    assert_eq!(e.expect_err("rate 0").kind, ErrorKind::InvalidArg);
    assert_eq!(listed(&t, None, "trace_rate"), ["1000"]);
    assert_eq!(listed(&t, None, "trace_level"), ["OFF"]);
    let no_file = Tracer::disabled();
    let e = no_file.update(None, &update(&[("trace_level", Some("TIMESTAMPS"))])).expect_err("no file");
    assert_eq!(e.message, "Attempting to set invalid trace setting :trace file name is not given");
    assert_eq!(listed(&no_file, None, "trace_file"), [""]);
}

#[test]
fn stamps_are_kept_in_time_order_with_the_request_id() {
    let (t, rx) = tracer(Settings { level: Level::Timestamps, rate: 1, ..Settings::default() });
    let trace = t.sample("m", "m", 2, || None);
    trace.stamp(Event::HttpRecvStart);
    trace.set_request_id("r1");
    let later = trace.clone();
    later.stamp(Event::RequestStart);
    drop(trace);
    assert!(rx.try_recv().is_err(), "a holder is left");
    drop(later);
    let done = rx.try_recv().expect("finished");
    assert_eq!((done.model.as_str(), done.version, done.request_id.as_str()), ("m", 2, "r1"));
    let names: Vec<_> = done.events.iter().map(|(e, ..)| *e).collect();
    assert_eq!(names, [Event::HttpRecvStart, Event::RequestStart]);
    assert!(done.events[0].1 <= done.events[1].1);
}

#[test]
fn events_have_wire_codes_and_steps_cross_processes_on_the_steady_clock() {
    for code in 0..=u8::MAX {
        if let Some(event) = Event::from_code(code) {
            assert_eq!(event.code(), code);
        }
    }
    assert_eq!(Event::from_code(Event::GrpcSendEnd.code()), Some(Event::GrpcSendEnd));
    assert_eq!(Event::from_code(16), None);
    let runner = Trace::collecting();
    runner.stamp(Event::QueueStart);
    runner.stamp(Event::ComputeEnd);
    let steps = runner.steps();
    assert_eq!(steps.iter().map(|(e, _)| *e).collect::<Vec<_>>(), [Event::QueueStart, Event::ComputeEnd]);
    assert!(steps[0].1 <= steps[1].1 && steps[0].1 > 0);
    // Stamped into another trace, the steps keep their steady-clock times (to the nanosecond).
    let front = Trace::collecting();
    for (event, ns) in &steps {
        front.stamp_steady(*event, *ns);
    }
    assert_eq!(front.steps(), steps);
    assert!(Trace::off().steps().is_empty());
}
