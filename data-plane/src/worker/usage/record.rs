//! The spool's record framing: `kind: u8 | len: u16 LE | payload (len bytes) | fnv1a32 LE` over
//! kind, len and payload. Integers are little-endian. A reader stops at the first frame that is
//! not complete yet (a write still under way, or cut by a crash) and at one whose checksum
//! fails (garbage after a power loss).

use tessera_protocol::usage::BATCH_SIZE_BUCKETS;

/// Bytes before the payload: kind and length.
const HEADER: usize = 3;
/// Bytes after the payload: the checksum.
const TRAILER: usize = 4;

const KIND_LABELS: u8 = 1;
const KIND_REQUEST: u8 = 2;
const KIND_EXECUTIONS: u8 = 3;
const KIND_SLICE: u8 = 4;

/// Executed-batch-size buckets in an executions record (the shared bounds plus overflow).
pub const BATCH_COUNTS: usize = BATCH_SIZE_BUCKETS.len() + 1;

/// What one labels id stands for; defined once per spool file before its first use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Labels {
    /// Tenant id (UUID text).
    pub tenant_id: String,
    /// Model name clients use.
    pub model_name: String,
    /// Registry version.
    pub version: i64,
    /// Slice profile the version's replicas hold (`cpu`, `gpu`, `mig-1g.10gb`).
    pub slice_profile: String,
}

/// One finished inference request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// Labels id.
    pub id: u32,
    /// When it finished, Unix microseconds.
    pub at_us: i64,
    /// Answered successfully.
    pub success: bool,
    /// Batch rows (inferences) of a successful request; 0 for a failure.
    pub rows: u32,
    /// Arrival (after authentication) to response, microseconds.
    pub latency_us: u64,
    /// Request body (HTTP) or message (gRPC) bytes.
    pub bytes_in: u64,
    /// Response body or message bytes (0 for a failure).
    pub bytes_out: u64,
}

/// Executions of one model version since the previous sample (deltas of its statistics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionsRecord {
    /// Labels id.
    pub id: u32,
    /// When sampled, Unix microseconds.
    pub at_us: i64,
    /// Executions (batches run).
    pub executions: u64,
    /// Their compute time (input + infer + output), nanoseconds.
    pub compute_ns: u64,
    /// Executions per batch-size bucket of `BATCH_SIZE_BUCKETS` (plus overflow).
    pub batch_counts: [u64; BATCH_COUNTS],
}

/// Slice time one replica held, inside one UTC minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceRecord {
    /// Labels id.
    pub id: u32,
    /// Start of the span, Unix microseconds (the minute it counts in).
    pub start_us: i64,
    /// Reserved microseconds (the span divided by the replicas sharing the slice).
    pub reserved_us: u64,
}

/// One spool record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Defines a labels id for the rest of the file.
    Labels(u32, Labels),
    /// A finished request.
    Request(RequestRecord),
    /// Execution deltas.
    Executions(ExecutionsRecord),
    /// Reserved slice time.
    Slice(SliceRecord),
}

impl Record {
    /// The record with its labels id set to `id`.
    pub fn with_id(mut self, id: u32) -> Self {
        match &mut self {
            Record::Labels(i, _) => *i = id,
            Record::Request(r) => r.id = id,
            Record::Executions(r) => r.id = id,
            Record::Slice(r) => r.id = id,
        }
        self
    }
}

/// What [`decode`] found at the start of a buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A record and its frame's length.
    Record(Record, usize),
    /// Not all of the frame is there (yet).
    Incomplete,
    /// The frame is damaged (checksum or contents); nothing after it can be trusted.
    Corrupt,
}

/// FNV-1a, 32 bits: enough to tell a written frame from leftover bytes.
fn checksum(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(*b)).wrapping_mul(0x0100_0193))
}

/// Encodes `record` as one frame; `None` when the labels are too long to frame (64 KiB).
pub fn encode(record: &Record) -> Option<Vec<u8>> {
    let mut out = vec![0u8; HEADER];
    let kind = match record {
        Record::Labels(id, labels) => {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&labels.version.to_le_bytes());
            for text in [&labels.tenant_id, &labels.model_name, &labels.slice_profile] {
                out.extend_from_slice(&u16::try_from(text.len()).ok()?.to_le_bytes());
                out.extend_from_slice(text.as_bytes());
            }
            KIND_LABELS
        }
        Record::Request(r) => {
            out.extend_from_slice(&r.id.to_le_bytes());
            out.extend_from_slice(&r.at_us.to_le_bytes());
            out.push(u8::from(r.success));
            out.extend_from_slice(&r.rows.to_le_bytes());
            for v in [r.latency_us, r.bytes_in, r.bytes_out] {
                out.extend_from_slice(&v.to_le_bytes());
            }
            KIND_REQUEST
        }
        Record::Executions(e) => {
            out.extend_from_slice(&e.id.to_le_bytes());
            out.extend_from_slice(&e.at_us.to_le_bytes());
            for v in [e.executions, e.compute_ns].iter().chain(&e.batch_counts) {
                out.extend_from_slice(&v.to_le_bytes());
            }
            KIND_EXECUTIONS
        }
        Record::Slice(s) => {
            out.extend_from_slice(&s.id.to_le_bytes());
            out.extend_from_slice(&s.start_us.to_le_bytes());
            out.extend_from_slice(&s.reserved_us.to_le_bytes());
            KIND_SLICE
        }
    };
    let len = u16::try_from(out.len() - HEADER).ok()?;
    out[0] = kind;
    out[1..HEADER].copy_from_slice(&len.to_le_bytes());
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    Some(out)
}

/// Decodes the frame at the start of `buf`.
pub fn decode(buf: &[u8]) -> Decoded {
    let Some(header) = buf.get(..HEADER) else { return Decoded::Incomplete };
    let len = usize::from(u16::from_le_bytes([header[1], header[2]]));
    let total = HEADER + len + TRAILER;
    let Some(frame) = buf.get(..total) else { return Decoded::Incomplete };
    let (body, sum) = frame.split_at(HEADER + len);
    if sum != checksum(body).to_le_bytes() {
        return Decoded::Corrupt;
    }
    let mut payload = Payload(&body[HEADER..]);
    match parse(header[0], &mut payload) {
        Some(record) if payload.0.is_empty() => Decoded::Record(record, total),
        _ => Decoded::Corrupt,
    }
}

fn parse(kind: u8, p: &mut Payload<'_>) -> Option<Record> {
    Some(match kind {
        KIND_LABELS => {
            let id = p.u32()?;
            let version = p.i64()?;
            let (tenant_id, model_name, slice_profile) = (p.text()?, p.text()?, p.text()?);
            Record::Labels(id, Labels { tenant_id, model_name, version, slice_profile })
        }
        KIND_REQUEST => Record::Request(RequestRecord {
            id: p.u32()?,
            at_us: p.i64()?,
            success: p.u8()? != 0,
            rows: p.u32()?,
            latency_us: p.u64()?,
            bytes_in: p.u64()?,
            bytes_out: p.u64()?,
        }),
        KIND_EXECUTIONS => {
            let (id, at_us, executions, compute_ns) = (p.u32()?, p.i64()?, p.u64()?, p.u64()?);
            let mut batch_counts = [0; BATCH_COUNTS];
            for count in &mut batch_counts {
                *count = p.u64()?;
            }
            Record::Executions(ExecutionsRecord { id, at_us, executions, compute_ns, batch_counts })
        }
        KIND_SLICE => Record::Slice(SliceRecord { id: p.u32()?, start_us: p.i64()?, reserved_us: p.u64()? }),
        _ => return None,
    })
}

/// A cursor over a payload.
struct Payload<'a>(&'a [u8]);

impl Payload<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[b]| b)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    fn i64(&mut self) -> Option<i64> {
        self.take().map(i64::from_le_bytes)
    }

    fn text(&mut self) -> Option<String> {
        let len = usize::from(u16::from_le_bytes(self.take()?));
        let bytes = self.0.get(..len)?;
        self.0 = &self.0[len..];
        String::from_utf8(bytes.to_vec()).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn samples() -> Vec<Record> {
        let labels = Labels {
            tenant_id: "0190a0a0-0000-7000-8000-00000000000a".into(),
            model_name: "add_sub".into(),
            version: 3,
            slice_profile: "mig-1g.10gb".into(),
        };
        vec![
            Record::Labels(7, labels),
            Record::Request(RequestRecord {
                id: 7,
                at_us: 1_700_000_000_123_456,
                success: true,
                rows: 4,
                latency_us: 1_234,
                bytes_in: 512,
                bytes_out: 256,
            }),
            Record::Executions(ExecutionsRecord {
                id: 7,
                at_us: -1,
                executions: 3,
                compute_ns: 9_000,
                batch_counts: [1, 0, 2, 0, 0, 0, 0, 0, 0, u64::MAX],
            }),
            Record::Slice(SliceRecord { id: 7, start_us: 60_000_000, reserved_us: 5_000_000 }),
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        for record in samples() {
            let frame = encode(&record).expect("encodable");
            assert_eq!(decode(&frame), Decoded::Record(record, frame.len()));
        }
    }

    #[test]
    fn a_cut_frame_is_incomplete_and_a_damaged_one_corrupt() {
        for record in samples() {
            let frame = encode(&record).expect("encodable");
            for cut in 0..frame.len() {
                assert_eq!(decode(&frame[..cut]), Decoded::Incomplete, "{record:?} cut at {cut}");
            }
            for i in 0..frame.len() {
                let mut damaged = frame.clone();
                damaged[i] ^= 0x40;
                assert_ne!(decode(&damaged), Decoded::Record(record.clone(), frame.len()), "byte {i}");
            }
        }
        assert_eq!(decode(&[0u8; 16]), Decoded::Corrupt, "zeros (a hole after a power loss) are not a record");
    }

    #[test]
    fn overlong_labels_are_not_framed() {
        let labels =
            Labels { tenant_id: "t".into(), model_name: "m".repeat(70_000), version: 1, slice_profile: "cpu".into() };
        assert_eq!(encode(&Record::Labels(1, labels)), None);
    }
}
