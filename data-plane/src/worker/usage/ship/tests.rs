use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::*;
use crate::worker::usage::record::Labels;
use crate::worker::usage::{Meter, Outcome};

/// A control plane that stores each key once; its first `lose_acks` calls store but then fail
/// (the acknowledgment is lost on the way back).
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<FakeState>>);

#[derive(Default)]
struct FakeState {
    stored: BTreeMap<String, UsageRecord>,
    calls: usize,
    lose_acks: usize,
    /// Records of this model are refused as invalid (and any batch holding one).
    invalid_model: Option<String>,
    /// Keys per call, as sent.
    sent: Vec<Vec<String>>,
}

impl UsageSink for Fake {
    fn send(&mut self, records: Vec<UsageRecord>) -> BoxFuture<'_, Result<Vec<String>, SendError>> {
        let mut state = self.0.lock();
        state.calls += 1;
        state.sent.push(records.iter().map(|r| r.key.clone()).collect());
        if records.iter().any(|r| state.invalid_model.as_deref() == Some(r.model_name.as_str())) {
            return Box::pin(async { Err(SendError::Rejected("unknown tenant".into())) });
        }
        let keys: Vec<String> = records.iter().map(|r| r.key.clone()).collect();
        for record in records {
            state.stored.entry(record.key.clone()).or_insert(record);
        }
        let lost = state.lose_acks > 0;
        state.lose_acks = state.lose_acks.saturating_sub(1);
        Box::pin(async move { if lost { Err(SendError::Unavailable("connection reset".into())) } else { Ok(keys) } })
    }
}

impl Fake {
    /// (requests, failures, inferences) over the stored keys.
    fn totals(&self) -> (u64, u64, u64) {
        let state = self.0.lock();
        state.stored.values().fold((0, 0, 0), |t, r| (t.0 + r.requests, t.1 + r.failures, t.2 + r.inferences))
    }
}

fn meter(dir: &std::path::Path, rotate_at: u64) -> Meter {
    let meter = Meter::open_with_rotation(dir, rotate_at).expect("open meter");
    meter.set_labels([Labels {
        tenant_id: "t".into(),
        model_name: "m".into(),
        version: 1,
        slice_profile: "cpu".into(),
    }]);
    meter
}

/// `n` requests, every third one failing, each of 2 rows.
fn serve(meter: &Meter, n: usize) {
    for i in 0..n {
        let outcome = Outcome { started: Instant::now(), success: i % 3 != 0, rows: 2, bytes_in: 10, bytes_out: 5 };
        meter.record_request("t", "m", 1, outcome);
    }
}

fn expected(n: u64) -> (u64, u64, u64) {
    let failures = n.div_ceil(3);
    (n - failures, failures, 2 * (n - failures))
}

#[tokio::test]
async fn everything_spooled_is_delivered_once_and_the_cursor_advances() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meter = meter(dir.path(), spool::ROTATE_BYTES);
    serve(&meter, 10);
    let fake = Fake::default();
    let mut shipper = Shipper::new(dir.path().to_path_buf(), "w".into(), fake.clone());
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    assert_eq!(fake.totals(), expected(10));
    let cursor = Cursor::load(dir.path()).expect("cursor");
    let live = &spool::files(dir.path()).expect("list")[0];
    assert_eq!(
        (cursor.file, cursor.offset, cursor.pending_end),
        (live.seq, live.path.metadata().expect("meta").len(), None)
    );
    // Nothing new: nothing sent.
    let calls = fake.0.lock().calls;
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    assert_eq!(fake.0.lock().calls, calls);
    serve(&meter, 5);
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    let (r, f, i) = expected(10);
    let (r2, f2, i2) = expected(5);
    assert_eq!(fake.totals(), (r + r2, f + f2, i + i2));
}

#[tokio::test]
async fn a_crash_before_the_ack_replays_the_same_range_under_the_same_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first_meter = meter(dir.path(), spool::ROTATE_BYTES);
    serve(&first_meter, 7);
    let fake = Fake::default();
    fake.0.lock().lose_acks = 1;
    let stop = CancellationToken::new();
    let mut shipper = Shipper::new(dir.path().to_path_buf(), "w".into(), fake.clone());
    // The first send is stored but its ack is lost; the worker dies while backing off.
    let crashed = {
        let ship = shipper.ship_all(&stop);
        let kill = async {
            while fake.0.lock().calls == 0 {
                tokio::task::yield_now().await;
            }
            stop.cancel();
        };
        tokio::join!(ship, kill).0
    };
    assert!(matches!(crashed, Err(ShipError::Stopped)), "{crashed:?}");
    assert!(Cursor::load(dir.path()).expect("cursor").pending_end.is_some());
    let first_keys = fake.0.lock().sent[0].clone();
    // More requests arrive in the same file before the restart...
    serve(&first_meter, 4);
    drop(first_meter);
    // ...and the restarted worker writes a new file.
    let second_meter = meter(dir.path(), spool::ROTATE_BYTES);
    serve(&second_meter, 2);
    let mut restarted = Shipper::new(dir.path().to_path_buf(), "w".into(), fake.clone());
    restarted.ship_all(&CancellationToken::new()).await.expect("ship");
    let state = fake.0.lock();
    assert_eq!(state.sent[1], first_keys, "the pending range went again, same keys");
    drop(state);
    let (a, b, c) = (expected(7), expected(4), expected(2));
    assert_eq!(fake.totals(), (a.0 + b.0 + c.0, a.1 + b.1 + c.1, a.2 + b.2 + c.2));
    assert_eq!(spool::files(dir.path()).expect("list").len(), 1, "the finished file was removed");
}

#[tokio::test]
async fn a_truncated_last_record_waits_and_a_sealed_one_is_dropped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meter = meter(dir.path(), spool::ROTATE_BYTES);
    serve(&meter, 3);
    let live = spool::files(dir.path()).expect("list").remove(0);
    let whole = std::fs::read(&live.path).expect("read");
    let frame = whole[whole.len() - 48..].to_vec();
    // Half of a request record, as a write still under way (or cut by a crash) leaves it.
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&live.path).expect("open");
        file.write_all(&frame[..20]).expect("half a record");
    }
    let fake = Fake::default();
    let mut shipper = Shipper::new(dir.path().to_path_buf(), "w".into(), fake.clone());
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    assert_eq!(fake.totals(), expected(3));
    assert_eq!(Cursor::load(dir.path()).expect("cursor").offset, whole.len() as u64);
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&live.path).expect("open");
        file.write_all(&frame[20..]).expect("the rest");
    }
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    let (r, f, i) = expected(3);
    assert_eq!(fake.totals(), (r + 1, f, i + 2), "the completed record (a success) shipped");
    // Cut again, then the worker restarts: the sealed file's torn end is dropped with it.
    {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&live.path).expect("open");
        file.write_all(&frame[..10]).expect("torn");
    }
    drop(meter);
    let again = self::meter(dir.path(), spool::ROTATE_BYTES);
    serve(&again, 1);
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    assert_eq!(fake.totals(), (r + 1, f + 1, i + 2));
    assert!(!live.path.exists());
}

/// A control plane whose every call takes long enough for the worker to serve `per_call` more
/// requests (steady load), for the first `calls_left` calls.
struct UnderLoad {
    fake: Fake,
    meter: Arc<Meter>,
    per_call: usize,
    calls_left: usize,
}

impl UsageSink for UnderLoad {
    fn send(&mut self, records: Vec<UsageRecord>) -> BoxFuture<'_, Result<Vec<String>, SendError>> {
        if self.calls_left > 0 {
            self.calls_left -= 1;
            serve(&self.meter, self.per_call);
        }
        self.fake.send(records)
    }
}

#[tokio::test]
async fn a_round_ships_what_was_there_and_leaves_what_comes_meanwhile_to_the_next() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meter = Arc::new(meter(dir.path(), spool::ROTATE_BYTES));
    serve(&meter, 10);
    let fake = Fake::default();
    let sink = UnderLoad { fake: fake.clone(), meter: meter.clone(), per_call: 3, calls_left: 50 };
    let mut shipper = Shipper::new(dir.path().to_path_buf(), "w".into(), sink);
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    // One call, not one per handful of records written while the last call was under way.
    assert_eq!(fake.0.lock().calls, 1);
    assert_eq!(fake.totals(), expected(10));
    // The three served meanwhile go in the next round.
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    assert_eq!(fake.0.lock().calls, 2);
    let ((r, f, i), (r2, f2, i2)) = (expected(10), expected(3));
    assert_eq!(fake.totals(), (r + r2, f + f2, i + i2));
}

#[tokio::test]
async fn rotated_files_ship_in_order_and_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meter = meter(dir.path(), 1_000);
    serve(&meter, 200);
    assert!(spool::files(dir.path()).expect("list").len() > 5);
    let fake = Fake::default();
    let mut shipper = Shipper::new(dir.path().to_path_buf(), "w".into(), fake.clone());
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    assert_eq!(fake.totals(), expected(200));
    assert_eq!(spool::files(dir.path()).expect("list").len(), 1, "only the live file is left");
    let keys: Vec<String> = fake.0.lock().sent.iter().flatten().cloned().collect();
    let unique: std::collections::HashSet<&String> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "no key was sent twice without a failure");
}

#[tokio::test]
async fn a_record_refused_as_invalid_is_set_aside_and_the_rest_flows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let meter = meter(dir.path(), spool::ROTATE_BYTES);
    meter.set_labels([Labels {
        tenant_id: "t".into(),
        model_name: "bad".into(),
        version: 1,
        slice_profile: "cpu".into(),
    }]);
    serve(&meter, 4);
    let outcome = Outcome { started: Instant::now(), success: true, rows: 1, bytes_in: 1, bytes_out: 1 };
    meter.record_request("t", "bad", 1, outcome);
    serve(&meter, 2);
    let fake = Fake::default();
    fake.0.lock().invalid_model = Some("bad".into());
    let mut shipper = Shipper::new(dir.path().to_path_buf(), "w".into(), fake.clone());
    shipper.ship_all(&CancellationToken::new()).await.expect("ship");
    let (a, b) = (expected(4), expected(2));
    assert_eq!(fake.totals(), (a.0 + b.0, a.1 + b.1, a.2 + b.2));
    let rejected = std::fs::read_to_string(dir.path().join(REJECTED_FILE)).expect("rejected.log");
    assert_eq!(rejected.lines().count(), 1);
    assert!(rejected.contains("unknown tenant") && rejected.contains("model_name: \"bad\""), "{rejected}");
    assert_eq!(Cursor::load(dir.path()).expect("cursor").pending_end, None);
}
