//! The front ↔ runner protocol: length-prefixed binary frames over the runner's Unix socket.
//!
//! A frame is `u32` LE length of the rest, `u8` kind, `u64` LE call id, then the body. The front
//! numbers its calls; the runner answers each id once, in any order (the batcher reorders).
//! A tensor's bytes are either inline (written once into the frame, read back as a slice of the
//! received frame) or, from 64 KiB, a position in one of the runner's shared-memory arenas
//! ([`super::shm`]); every runner frame starts with the request regions it gives back. The
//! runner is not trusted: the front decodes its frames with every length and position checked
//! and checks each output's size against its type and shape (an output without bytes is one
//! the runner wrote into a client's CUDA region: [`super::RemoteVersion`] checks it was asked
//! for there).
//!
//! A request whose tensors are in clients' CUDA regions carries references to them (region id,
//! IPC handle, device id, window) after its outputs; the runner opens the regions and copies
//! ([`super::cuda`]), and a [`ToRunner::CudaRelease`] notice closes a region once it is gone.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;

use crate::engine::cuda_ipc::{CudaIo, CudaRef, CudaRegionRef, HANDLE_BYTES, IpcHandle};
use crate::engine::infer::{ParamValue, Parameters, ValidInferRequest};
use crate::engine::load_error::{LoadError, LoadErrorKind};
use crate::engine::model_spec::{IoInfo, ModelIo};
use crate::engine::stats::Tally;
use crate::engine::tensor::{InputTensor, OutputTensor, check_data_size, checked_element_count};
use crate::error::{Error, ErrorKind};
use crate::trace::Event;

use super::shm::{FrontShm, RunnerShm};

/// Largest frame either side accepts (a request is capped far lower by the front's input limit).
pub const MAX_FRAME: usize = 1 << 30;
/// Bytes before a frame's body: length, kind, id.
pub const HEADER: usize = 4 + 1 + 8;

/// What the front asks a runner.
#[derive(Debug)]
pub enum ToRunner {
    /// Load a model version; answered with [`FromRunner::Loaded`] or [`FromRunner::LoadFailed`].
    Load(Box<LoadCall>),
    /// Drop a version (requests already running finish); answered with [`FromRunner::Done`].
    Unload {
        /// Manager key.
        key: String,
        /// Version.
        version: i64,
    },
    /// Run a checked request; answered with [`FromRunner::Answer`].
    Infer(InferCall),
    /// The client of call `id` left: drop it if it has not run yet. Not answered.
    Cancel,
    /// Liveness; answered with [`FromRunner::Pong`].
    Ping,
    /// A client's CUDA region is gone (unregistered, and no request names it): close it if it
    /// is open. Not answered.
    CudaRelease {
        /// The region's id ([`CudaRegionRef::id`]).
        id: u64,
    },
}

/// A model version to load in the runner.
#[derive(Debug, Clone)]
pub struct LoadCall {
    /// Manager key (`<tenant>/<model>` on workers).
    pub key: String,
    /// The name clients use.
    pub name: String,
    /// Version.
    pub version: i64,
    /// The model file.
    pub file: PathBuf,
    /// The configuration as given (the runner completes it as the front does).
    pub config: ModelConfig,
}

/// One request for a loaded version.
#[derive(Debug)]
pub struct InferCall {
    /// Manager key.
    pub key: String,
    /// Version.
    pub version: i64,
    /// The request, already checked by the front against the same spec.
    pub request: ValidInferRequest,
}

/// What a runner answers.
#[derive(Debug)]
pub enum FromRunner {
    /// The version loaded; what the ONNX graph declares.
    Loaded(ModelIo),
    /// An unload (or a call the runner could not take) failed.
    Failed(Error),
    /// A load failed, with the kind of failure (which decides whether the worker tries again).
    LoadFailed(LoadError),
    /// An unload finished.
    Done,
    /// A request ran (or failed), with the statistics its version counted since the last answer.
    Answer {
        /// Outputs, or the error the client gets.
        result: Result<Vec<OutputTensor>, Error>,
        /// Statistics delta of the version ([`Tally::since`]).
        stats: Tally,
        /// For a traced request: the steps the runner stamped (queue, compute), in steady-clock
        /// nanoseconds, which the front adds to the request's trace.
        steps: Vec<(Event, u64)>,
    },
    /// Statistics a version counted that no answer carried (cancelled and timed-out requests
    /// leave the queue later); sent unasked, with call id 0.
    Stats {
        /// Manager key.
        key: String,
        /// Version.
        version: i64,
        /// Delta since the last report ([`Tally::since`]).
        stats: Tally,
    },
    /// Liveness answer: the runner's resident memory in bytes.
    Pong {
        /// Resident set size.
        rss_bytes: u64,
    },
    /// Nothing but request regions given back (every runner frame carries those); call id 0.
    Released,
}

mod kind {
    pub const LOAD: u8 = 1;
    pub const UNLOAD: u8 = 2;
    pub const INFER: u8 = 3;
    pub const CANCEL: u8 = 4;
    pub const PING: u8 = 5;
    pub const CUDA_RELEASE: u8 = 6;
    pub const LOADED: u8 = 101;
    pub const FAILED: u8 = 102;
    pub const DONE: u8 = 103;
    pub const ANSWER_OK: u8 = 104;
    pub const ANSWER_ERR: u8 = 105;
    pub const PONG: u8 = 106;
    pub const STATS: u8 = 107;
    pub const RELEASED: u8 = 108;
    pub const LOAD_FAILED: u8 = 109;
}

/// A malformed frame; the connection is dropped, since nothing after it can be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed runner frame: {0}")]
pub struct WireError(pub String);

type WireResult<T> = Result<T, WireError>;

fn bad(what: impl Into<String>) -> WireError {
    WireError(what.into())
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Appends one frame: the body is written by `body`, then the length is patched in.
fn frame(out: &mut BytesMut, kind: u8, id: u64, body: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    out.put_u32_le(0);
    out.put_u8(kind);
    out.put_u64_le(id);
    body(out);
    let len = u32::try_from(out.len() - start - 4).unwrap_or(u32::MAX);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

fn put_str(out: &mut BytesMut, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_u64_le(b.len() as u64);
    out.put_slice(b);
}

/// Places a tensor's bytes in shared memory: their position, or `None` to write them inline.
type Place<'a> = Option<&'a dyn Fn(&[u8]) -> Option<u64>>;
/// Reads a tensor's bytes from shared memory at (position, length); `None` when outside the arena.
type Fetch<'a> = Option<&'a dyn Fn(u64, u64) -> Option<Bytes>>;

/// Tensor data tags: the bytes follow, or a shared-memory (position, length).
const INLINE: u8 = 0;
const SHARED: u8 = 1;

fn put_tensor(out: &mut BytesMut, name: &str, datatype: DataType, shape: &[i64], data: &[u8], place: Place<'_>) {
    put_str(out, name);
    put_str(out, datatype.as_wire());
    out.put_u32_le(shape.len() as u32);
    for d in shape {
        out.put_i64_le(*d);
    }
    match place.and_then(|place| place(data)) {
        Some(pos) => {
            out.put_u8(SHARED);
            out.put_u64_le(pos);
            out.put_u64_le(data.len() as u64);
        }
        None => {
            out.put_u8(INLINE);
            put_bytes(out, data);
        }
    }
}

/// Bytes a tensor takes in a frame: all of it, or a position when shared memory takes it.
fn frame_size(data: &[u8], shared: bool) -> usize {
    if shared && data.len() >= super::shm::INLINE_MAX { 64 } else { data.len() + 64 }
}

fn put_params(out: &mut BytesMut, params: &Parameters) {
    out.put_u32_le(params.len() as u32);
    for (k, v) in params {
        put_str(out, k);
        match v {
            ParamValue::Bool(b) => {
                out.put_u8(0);
                out.put_u8(u8::from(*b));
            }
            ParamValue::Int(i) => {
                out.put_u8(1);
                out.put_i64_le(*i);
            }
            ParamValue::Uint(u) => {
                out.put_u8(2);
                out.put_u64_le(*u);
            }
            ParamValue::Double(d) => {
                out.put_u8(3);
                out.put_f64_le(*d);
            }
            ParamValue::Str(s) => {
                out.put_u8(4);
                put_str(out, s);
            }
        }
    }
}

fn put_error(out: &mut BytesMut, e: &Error) {
    out.put_u8(error_kind_code(e.kind));
    put_str(out, &e.message);
}

fn put_tally(out: &mut BytesMut, t: &Tally) {
    out.put_u32_le(t.counters.len() as u32);
    for c in &t.counters {
        out.put_u64_le(*c);
    }
    out.put_u32_le(t.batches.len() as u32);
    for (size, values) in &t.batches {
        out.put_u64_le(*size);
        for v in values {
            out.put_u64_le(*v);
        }
    }
}

fn put_steps(out: &mut BytesMut, steps: &[(Event, u64)]) {
    out.put_u32_le(steps.len() as u32);
    for (event, ns) in steps {
        out.put_u8(event.code());
        out.put_u64_le(*ns);
    }
}

fn put_io(out: &mut BytesMut, infos: &[IoInfo]) {
    out.put_u32_le(infos.len() as u32);
    for i in infos {
        put_str(out, &i.name);
        put_str(out, i.datatype.map_or("", DataType::as_wire));
        out.put_u32_le(i.shape.len() as u32);
        for d in &i.shape {
            out.put_i64_le(*d);
        }
    }
}

impl ToRunner {
    /// Appends this call as frame `id`, its large tensors placed in `shm` when it has room.
    pub fn encode(&self, id: u64, out: &mut BytesMut, shm: Option<&FrontShm>) {
        match self {
            ToRunner::Load(call) => frame(out, kind::LOAD, id, |b| {
                put_str(b, &call.key);
                put_str(b, &call.name);
                b.put_i64_le(call.version);
                put_bytes(b, call.file.as_os_str().as_encoded_bytes());
                put_bytes(b, &call.config.encode_to_vec());
            }),
            ToRunner::Unload { key, version } => frame(out, kind::UNLOAD, id, |b| {
                put_str(b, key);
                b.put_i64_le(*version);
            }),
            ToRunner::Infer(call) => frame(out, kind::INFER, id, |b| {
                let place = |data: &[u8]| shm.and_then(|shm| shm.put(data));
                encode_infer(b, call, shm.is_some().then_some(&place))
            }),
            ToRunner::Cancel => frame(out, kind::CANCEL, id, |_| {}),
            ToRunner::Ping => frame(out, kind::PING, id, |_| {}),
            ToRunner::CudaRelease { id: region } => frame(out, kind::CUDA_RELEASE, id, |b| b.put_u64_le(*region)),
        }
    }
}

fn encode_infer(b: &mut BytesMut, call: &InferCall, place: Place<'_>) {
    let r = &call.request;
    let data: usize = r.inputs.iter().flatten().map(|t| frame_size(&t.data, place.is_some())).sum();
    b.reserve(data + 128);
    put_str(b, &call.key);
    b.put_i64_le(call.version);
    put_str(b, &r.id);
    put_params(b, &r.parameters);
    b.put_u64_le(r.priority);
    b.put_u64_le(r.timeout_us);
    b.put_u64_le(r.batch_size as u64);
    b.put_u32_le(r.inputs.len() as u32);
    for input in &r.inputs {
        match input {
            None => b.put_u8(0),
            Some(t) => {
                b.put_u8(1);
                put_tensor(b, &t.name, t.datatype, &t.shape, &t.data, place);
            }
        }
    }
    b.put_u32_le(r.outputs.len() as u32);
    for o in &r.outputs {
        b.put_u32_le(*o as u32);
    }
    put_cuda_io(b, &r.cuda);
    b.put_u8(u8::from(r.trace.is_on()));
}

/// The request's tensors in CUDA regions: inputs, then outputs, each a name and a reference.
fn put_cuda_io(b: &mut BytesMut, io: &CudaIo) {
    for list in [&io.inputs, &io.outputs] {
        b.put_u32_le(list.len() as u32);
        for (name, at) in list {
            put_str(b, name);
            let r = &at.region;
            b.put_u64_le(r.id);
            put_str(b, &r.name);
            b.put_slice(&r.handle.0);
            b.put_i64_le(r.device_id);
            b.put_u64_le(r.byte_size);
            b.put_u64_le(at.offset);
            b.put_u64_le(at.byte_size);
        }
    }
}

impl FromRunner {
    /// Appends this answer as frame `id`, with the request regions `shm` has to give back and
    /// large outputs placed in it when it has room. Call it under the socket's write lock, so
    /// outputs take the response arena in the order their frames go out.
    pub fn encode(&self, id: u64, out: &mut BytesMut, shm: Option<&RunnerShm>) {
        let released = shm.map(RunnerShm::take_released).unwrap_or_default();
        let kind = match self {
            FromRunner::Loaded(_) => kind::LOADED,
            FromRunner::Failed(_) => kind::FAILED,
            FromRunner::LoadFailed(_) => kind::LOAD_FAILED,
            FromRunner::Done => kind::DONE,
            FromRunner::Answer { result: Ok(_), .. } => kind::ANSWER_OK,
            FromRunner::Answer { result: Err(_), .. } => kind::ANSWER_ERR,
            FromRunner::Pong { .. } => kind::PONG,
            FromRunner::Stats { .. } => kind::STATS,
            FromRunner::Released => kind::RELEASED,
        };
        frame(out, kind, id, |b| {
            b.put_u32_le(released.len() as u32);
            for pos in &released {
                b.put_u64_le(*pos);
            }
            self.encode_body(b, shm);
        });
    }

    fn encode_body(&self, b: &mut BytesMut, shm: Option<&RunnerShm>) {
        match self {
            FromRunner::Loaded(io) => {
                put_io(b, &io.inputs);
                put_io(b, &io.outputs);
            }
            FromRunner::Failed(e) => put_error(b, e),
            FromRunner::LoadFailed(e) => {
                b.put_u8(load_kind_code(e.kind));
                put_str(b, &e.message);
            }
            FromRunner::Done | FromRunner::Released => {}
            FromRunner::Answer { result: Ok(outputs), stats, steps } => {
                b.reserve(outputs.iter().map(|t| frame_size(&t.data, shm.is_some())).sum());
                put_tally(b, stats);
                put_steps(b, steps);
                b.put_u32_le(outputs.len() as u32);
                let place = |data: &[u8]| shm.and_then(|shm| shm.put(data));
                for t in outputs {
                    put_tensor(b, &t.name, t.datatype, &t.shape, &t.data, shm.is_some().then_some(&place));
                }
            }
            FromRunner::Answer { result: Err(e), stats, steps } => {
                put_tally(b, stats);
                put_steps(b, steps);
                put_error(b, e);
            }
            FromRunner::Pong { rss_bytes } => b.put_u64_le(*rss_bytes),
            FromRunner::Stats { key, version, stats } => {
                put_str(b, key);
                b.put_i64_le(*version);
                put_tally(b, stats);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Takes one whole frame off the front of `buf`: `Ok(None)` until it has fully arrived.
pub fn split_frame(buf: &mut BytesMut) -> WireResult<Option<(u8, u64, Bytes)>> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if !(HEADER - 4..=MAX_FRAME).contains(&len) {
        return Err(bad(format!("frame length {len}")));
    }
    if buf.len() < 4 + len {
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    let mut frame = buf.split_to(4 + len).freeze();
    frame.advance(4);
    let kind = frame.get_u8();
    let id = frame.get_u64_le();
    Ok(Some((kind, id, frame)))
}

/// A bounds-checked reader over a frame body.
struct Reader(Bytes);

impl Reader {
    fn need(&self, n: usize, what: &str) -> WireResult<()> {
        if self.0.remaining() < n { Err(bad(format!("{what} runs past the end of the frame"))) } else { Ok(()) }
    }

    fn u8(&mut self, what: &str) -> WireResult<u8> {
        self.need(1, what)?;
        Ok(self.0.get_u8())
    }

    fn u32(&mut self, what: &str) -> WireResult<u32> {
        self.need(4, what)?;
        Ok(self.0.get_u32_le())
    }

    fn u64(&mut self, what: &str) -> WireResult<u64> {
        self.need(8, what)?;
        Ok(self.0.get_u64_le())
    }

    fn i64(&mut self, what: &str) -> WireResult<i64> {
        self.need(8, what)?;
        Ok(self.0.get_i64_le())
    }

    /// A count of items each at least `min_size` bytes long, checked against what is left.
    fn count(&mut self, min_size: usize, what: &str) -> WireResult<usize> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_size) > self.0.remaining() {
            return Err(bad(format!("{what} count {n} exceeds the frame")));
        }
        Ok(n)
    }

    fn bytes(&mut self, what: &str) -> WireResult<Bytes> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| bad(format!("{what} length")))?;
        self.need(len, what)?;
        Ok(self.0.split_to(len))
    }

    fn string(&mut self, what: &str) -> WireResult<String> {
        let b = self.bytes(what)?;
        String::from_utf8(b.to_vec()).map_err(|_| bad(format!("{what} is not UTF-8")))
    }

    fn shape(&mut self, what: &str) -> WireResult<Vec<i64>> {
        let n = self.count(8, what)?;
        (0..n).map(|_| self.i64(what)).collect()
    }

    fn datatype(&mut self, what: &str) -> WireResult<DataType> {
        let s = self.string(what)?;
        DataType::from_wire(&s).ok_or_else(|| bad(format!("{what} has unknown datatype '{s}'")))
    }

    /// A tensor: name, type, shape, bytes, and whether the bytes came from shared memory.
    fn tensor(&mut self, fetch: Fetch<'_>) -> WireResult<(String, DataType, Vec<i64>, Bytes, bool)> {
        let name = self.string("tensor name")?;
        let datatype = self.datatype("tensor")?;
        let shape = self.shape("tensor shape")?;
        let tag = self.u8("tensor data tag")?;
        let data = match tag {
            INLINE => self.bytes("tensor data")?,
            SHARED => {
                let (pos, len) = (self.u64("tensor position")?, self.u64("tensor length")?);
                let fetch =
                    fetch.ok_or_else(|| bad(format!("tensor '{name}' is in shared memory, but none is mapped")))?;
                fetch(pos, len).ok_or_else(|| {
                    bad(format!("tensor '{name}' at {pos} ({len} bytes) lies outside the shared memory"))
                })?
            }
            t => return Err(bad(format!("tensor data tag {t}"))),
        };
        Ok((name, datatype, shape, data, tag == SHARED))
    }

    /// The CUDA references of a request ([`put_cuda_io`]); each window inside its region.
    fn cuda_io(&mut self) -> WireResult<CudaIo> {
        let mut io = CudaIo::default();
        for list in [&mut io.inputs, &mut io.outputs] {
            let n = self.count(8 + 8 + 8 + HANDLE_BYTES + 32, "CUDA references")?;
            for _ in 0..n {
                let name = self.string("CUDA tensor name")?;
                let id = self.u64("CUDA region id")?;
                let region_name = self.string("CUDA region name")?;
                self.need(HANDLE_BYTES, "CUDA handle")?;
                let handle = IpcHandle::from_slice(&self.0.split_to(HANDLE_BYTES)).ok_or_else(|| bad("CUDA handle"))?;
                let device_id = self.i64("CUDA device id")?;
                let byte_size = self.u64("CUDA region size")?;
                let (offset, len) = (self.u64("CUDA offset")?, self.u64("CUDA byte size")?);
                if offset.checked_add(len).is_none_or(|end| end > byte_size) {
                    return Err(bad(format!("CUDA window of '{name}' lies outside its region")));
                }
                let region = Arc::new(CudaRegionRef { id, name: region_name, handle, device_id, byte_size });
                list.push((name, CudaRef { region, offset, byte_size: len, lease: None }));
            }
        }
        Ok(io)
    }

    fn params(&mut self) -> WireResult<Parameters> {
        let n = self.count(10, "parameters")?;
        let mut params = Parameters::new();
        for _ in 0..n {
            let key = self.string("parameter name")?;
            let value = match self.u8("parameter type")? {
                0 => ParamValue::Bool(self.u8("parameter")? != 0),
                1 => ParamValue::Int(self.i64("parameter")?),
                2 => ParamValue::Uint(self.u64("parameter")?),
                3 => ParamValue::Double(f64::from_bits(self.u64("parameter")?)),
                4 => ParamValue::Str(self.string("parameter")?),
                t => return Err(bad(format!("parameter type {t}"))),
            };
            params.insert(key, value);
        }
        Ok(params)
    }

    fn error(&mut self) -> WireResult<Error> {
        let kind = error_kind(self.u8("error kind")?)?;
        let message = self.string("error message")?;
        Ok(Error::new(kind, message))
    }

    fn tally(&mut self) -> WireResult<Tally> {
        let n = self.count(8, "statistics")?;
        let counters = (0..n).map(|_| self.u64("statistics")).collect::<WireResult<_>>()?;
        let n = self.count(40, "batch statistics")?;
        let mut batches = Vec::with_capacity(n);
        for _ in 0..n {
            let size = self.u64("batch size")?;
            let mut values = [0; 4];
            for v in &mut values {
                *v = self.u64("batch statistics")?;
            }
            batches.push((size, values));
        }
        Ok(Tally { counters, batches })
    }

    fn steps(&mut self) -> WireResult<Vec<(Event, u64)>> {
        let n = self.count(9, "trace steps")?;
        (0..n)
            .map(|_| {
                let code = self.u8("trace step")?;
                let event = Event::from_code(code).ok_or_else(|| bad(format!("trace step {code}")))?;
                Ok((event, self.u64("trace step time")?))
            })
            .collect()
    }

    fn io(&mut self) -> WireResult<Vec<IoInfo>> {
        let n = self.count(20, "model io")?;
        let mut infos = Vec::with_capacity(n);
        for _ in 0..n {
            let name = self.string("io name")?;
            let dt = self.string("io datatype")?;
            let datatype = if dt.is_empty() {
                None
            } else {
                Some(DataType::from_wire(&dt).ok_or_else(|| bad(format!("io datatype '{dt}'")))?)
            };
            let shape = self.shape("io shape")?;
            infos.push(IoInfo { name, datatype, shape });
        }
        Ok(infos)
    }

    fn end(&self) -> WireResult<()> {
        if self.0.has_remaining() { Err(bad("trailing bytes")) } else { Ok(()) }
    }
}

impl ToRunner {
    /// Decodes a frame the front sent (runner side); tensors in shared memory are read in place.
    pub fn decode(kind: u8, body: Bytes, shm: Option<&RunnerShm>) -> WireResult<Self> {
        let mut r = Reader(body);
        let call = match kind {
            kind::LOAD => {
                let key = r.string("key")?;
                let name = r.string("name")?;
                let version = r.i64("version")?;
                let file = PathBuf::from(r.string("file")?);
                let config = ModelConfig::decode(r.bytes("config")?).map_err(|e| bad(format!("config: {e}")))?;
                ToRunner::Load(Box::new(LoadCall { key, name, version, file, config }))
            }
            kind::UNLOAD => ToRunner::Unload { key: r.string("key")?, version: r.i64("version")? },
            kind::INFER => {
                let fetch = |pos, len| shm.and_then(|shm| shm.get(pos, len));
                ToRunner::Infer(decode_infer(&mut r, shm.is_some().then_some(&fetch))?)
            }
            kind::CANCEL => ToRunner::Cancel,
            kind::PING => ToRunner::Ping,
            kind::CUDA_RELEASE => ToRunner::CudaRelease { id: r.u64("CUDA region id")? },
            k => return Err(bad(format!("kind {k}"))),
        };
        r.end()?;
        Ok(call)
    }
}

fn decode_infer(r: &mut Reader, fetch: Fetch<'_>) -> WireResult<InferCall> {
    let key = r.string("key")?;
    let version = r.i64("version")?;
    let id = r.string("request id")?;
    let parameters = r.params()?;
    let priority = r.u64("priority")?;
    let timeout_us = r.u64("timeout")?;
    let batch_size = usize::try_from(r.u64("batch size")?).map_err(|_| bad("batch size"))?;
    let n = r.count(1, "inputs")?;
    let mut inputs = Vec::with_capacity(n);
    for _ in 0..n {
        inputs.push(match r.u8("input presence")? {
            0 => None,
            _ => {
                let (name, datatype, shape, data, _) = r.tensor(fetch)?;
                Some(InputTensor { name, datatype, shape, data })
            }
        });
    }
    let n = r.count(4, "outputs")?;
    let outputs = (0..n).map(|_| r.u32("output").map(|o| o as usize)).collect::<WireResult<_>>()?;
    let cuda = r.cuda_io()?;
    // A request its front traces records its steps here, to send back with the answer.
    let trace = match r.u8("traced")? {
        0 => crate::trace::Trace::off(),
        _ => crate::trace::Trace::collecting(),
    };
    let request = ValidInferRequest { id, parameters, priority, timeout_us, batch_size, inputs, outputs, cuda, trace };
    Ok(InferCall { key, version, request })
}

impl FromRunner {
    /// Decodes a frame a runner sent (front side), checking every output tensor's size and
    /// every shared-memory position; outputs in shared memory are copied out, and the request
    /// regions the frame gives back return to `shm`.
    pub fn decode(kind: u8, body: Bytes, shm: Option<&FrontShm>) -> WireResult<Self> {
        let mut r = Reader(body);
        let n = r.count(8, "released regions")?;
        for _ in 0..n {
            let pos = r.u64("released region")?;
            if !shm.is_some_and(|shm| shm.release(pos)) {
                return Err(bad(format!("the runner gave back region {pos}, which it does not hold")));
            }
        }
        let fetch = |pos, len| shm.and_then(|shm| shm.take(pos, len));
        let fetch: Fetch<'_> = shm.is_some().then_some(&fetch);
        let answer = match kind {
            kind::LOADED => FromRunner::Loaded(ModelIo { inputs: r.io()?, outputs: r.io()? }),
            kind::FAILED => FromRunner::Failed(r.error()?),
            kind::LOAD_FAILED => {
                let kind = load_kind(r.u8("load error kind")?)?;
                FromRunner::LoadFailed(LoadError::new(kind, r.string("load error message")?))
            }
            kind::DONE => FromRunner::Done,
            kind::ANSWER_OK => {
                let stats = r.tally()?;
                let steps = r.steps()?;
                let n = r.count(20, "outputs")?;
                let mut outputs = Vec::with_capacity(n);
                for _ in 0..n {
                    let (name, datatype, shape, data, shared) = r.tensor(fetch)?;
                    if let Some(shm) = shm {
                        shm.count_response(shared, data.len());
                    }
                    let count = checked_element_count(&name, &shape).map_err(|e| bad(e.message))?;
                    // No bytes: written into a CUDA region (the caller checks it was asked for).
                    if !data.is_empty() {
                        check_data_size(&name, datatype, count, &data).map_err(|e| bad(e.message))?;
                    }
                    outputs.push(OutputTensor { name, datatype, shape, data });
                }
                FromRunner::Answer { result: Ok(outputs), stats, steps }
            }
            kind::ANSWER_ERR => {
                let (stats, steps) = (r.tally()?, r.steps()?);
                FromRunner::Answer { result: Err(r.error()?), stats, steps }
            }
            kind::PONG => FromRunner::Pong { rss_bytes: r.u64("rss")? },
            kind::STATS => FromRunner::Stats { key: r.string("key")?, version: r.i64("version")?, stats: r.tally()? },
            kind::RELEASED => FromRunner::Released,
            k => return Err(bad(format!("kind {k}"))),
        };
        r.end()?;
        Ok(answer)
    }
}

const KINDS: [ErrorKind; 10] = [
    ErrorKind::InvalidArg,
    ErrorKind::NotFound,
    ErrorKind::Unavailable,
    ErrorKind::Unsupported,
    ErrorKind::TooLarge,
    ErrorKind::Cancelled,
    ErrorKind::Internal,
    ErrorKind::Unauthenticated,
    ErrorKind::PermissionDenied,
    ErrorKind::TooManyRequests,
];

fn error_kind_code(kind: ErrorKind) -> u8 {
    KINDS.iter().position(|k| *k == kind).map_or(6, |i| i as u8)
}

fn error_kind(code: u8) -> WireResult<ErrorKind> {
    KINDS.get(usize::from(code)).copied().ok_or_else(|| bad(format!("error kind {code}")))
}

fn load_kind_code(kind: LoadErrorKind) -> u8 {
    LoadErrorKind::ALL.iter().position(|k| *k == kind).map_or(u8::MAX, |i| i as u8)
}

fn load_kind(code: u8) -> WireResult<LoadErrorKind> {
    LoadErrorKind::ALL.get(usize::from(code)).copied().ok_or_else(|| bad(format!("load error kind {code}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, rows: i64) -> InputTensor {
        let data: Vec<u8> = (0..rows * 16).flat_map(|i| (i as i32).to_le_bytes()).collect();
        InputTensor { name: name.into(), datatype: DataType::Int32, shape: vec![rows, 16], data: data.into() }
    }

    fn one_frame(buf: &mut BytesMut) -> (u8, u64, Bytes) {
        split_frame(buf).expect("well formed").expect("complete")
    }

    #[test]
    fn infer_calls_round_trip_with_tensor_bytes_intact() {
        let mut parameters = Parameters::new();
        parameters.insert("priority".into(), ParamValue::Uint(2));
        parameters.insert("s".into(), ParamValue::Str("x".into()));
        parameters.insert("d".into(), ParamValue::Double(0.5));
        let request = ValidInferRequest {
            id: "req-1".into(),
            parameters,
            priority: 2,
            timeout_us: 10,
            batch_size: 3,
            inputs: vec![Some(tensor("INPUT0", 3)), None],
            outputs: vec![1, 0],
            cuda: Default::default(),
            trace: crate::trace::Trace::collecting(),
        };
        let mut buf = BytesMut::new();
        ToRunner::Infer(InferCall { key: "t/m".into(), version: 4, request }).encode(77, &mut buf, None);
        let (kind, id, body) = one_frame(&mut buf);
        assert!(buf.is_empty());
        let ToRunner::Infer(call) = ToRunner::decode(kind, body, None).expect("decodes") else { panic!("not infer") };
        assert_eq!((id, call.key.as_str(), call.version), (77, "t/m", 4));
        let r = call.request;
        assert_eq!((r.id.as_str(), r.priority, r.timeout_us, r.batch_size, r.outputs), ("req-1", 2, 10, 3, vec![1, 0]));
        assert_eq!(r.parameters.get("d"), Some(&ParamValue::Double(0.5)));
        let input = r.inputs[0].as_ref().expect("present");
        assert_eq!((input.shape.as_slice(), input.data.as_ref()), (&[3, 16][..], tensor("x", 3).data.as_ref()));
        assert!(r.inputs[1].is_none());
        assert!(r.trace.is_on(), "a traced request is traced in the runner too");
    }

    #[test]
    fn answers_round_trip_and_partial_frames_wait() {
        let out =
            OutputTensor { name: "OUT".into(), datatype: DataType::Fp32, shape: vec![2], data: vec![0; 8].into() };
        let stats = Tally { counters: vec![1, 2, 3], batches: vec![(4, [1, 2, 3, 4])] };
        let mut buf = BytesMut::new();
        let steps = vec![(Event::QueueStart, 10), (Event::ComputeStart, 20), (Event::ComputeEnd, u64::MAX)];
        FromRunner::Answer { result: Ok(vec![out]), stats: stats.clone(), steps: steps.clone() }
            .encode(5, &mut buf, None);
        FromRunner::Answer {
            result: Err(Error::unavailable("queue full")),
            stats: Tally::default(),
            steps: Vec::new(),
        }
        .encode(6, &mut buf, None);
        let whole = buf.clone();
        let mut partial = BytesMut::from(&whole[..whole.len() - 1]);
        let (k, id, body) = one_frame(&mut partial);
        assert_eq!(id, 5);
        let FromRunner::Answer { result: Ok(outputs), stats: got, steps: got_steps } =
            FromRunner::decode(k, body, None).expect("ok")
        else {
            panic!("not an answer")
        };
        assert_eq!((outputs[0].shape.as_slice(), got, got_steps), (&[2][..], stats, steps));
        assert!(split_frame(&mut partial).expect("fine").is_none(), "the second frame is incomplete");
        let (_, _, _) = one_frame(&mut buf);
        let (k, id, body) = one_frame(&mut buf);
        let FromRunner::Answer { result: Err(e), .. } = FromRunner::decode(k, body, None).expect("err") else {
            panic!()
        };
        assert_eq!((id, e.kind, e.message.as_str()), (6, ErrorKind::Unavailable, "queue full"));
    }

    #[test]
    fn load_failures_keep_their_kind() {
        for kind in LoadErrorKind::ALL {
            let mut buf = BytesMut::new();
            FromRunner::LoadFailed(LoadError::new(kind, "why")).encode(3, &mut buf, None);
            let (k, id, body) = one_frame(&mut buf);
            let FromRunner::LoadFailed(e) = FromRunner::decode(k, body, None).expect("decodes") else {
                panic!("not a load failure")
            };
            assert_eq!((id, e), (3, LoadError::new(kind, "why")));
        }
    }

    #[test]
    fn hostile_frames_are_refused_not_trusted() {
        // An output whose bytes do not match its shape.
        let lie =
            OutputTensor { name: "OUT".into(), datatype: DataType::Fp32, shape: vec![4], data: vec![0; 8].into() };
        let mut buf = BytesMut::new();
        FromRunner::Answer { result: Ok(vec![lie]), stats: Tally::default(), steps: Vec::new() }
            .encode(1, &mut buf, None);
        let (k, _, body) = one_frame(&mut buf);
        assert!(FromRunner::decode(k, body, None).is_err());
        // Lengths that run past the end, absurd counts, unknown kinds, oversized frames.
        let mut buf = BytesMut::new();
        FromRunner::Loaded(ModelIo::default()).encode(1, &mut buf, None);
        let (k, _, body) = one_frame(&mut buf);
        let mut cut = body.to_vec();
        cut[0] = 0xff;
        assert!(FromRunner::decode(k, Bytes::from(cut), None).is_err());
        assert!(FromRunner::decode(99, Bytes::new(), None).is_err());
        let mut huge = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        assert!(split_frame(&mut huge).is_err());
        let mut short = BytesMut::from(&3u32.to_le_bytes()[..]);
        assert!(split_frame(&mut short).is_err());
        // Trailing bytes.
        let mut buf = BytesMut::new();
        frame(&mut buf, kind::DONE, 1, |b| {
            b.put_u32_le(0);
            b.put_u8(0);
        });
        let (k, _, body) = one_frame(&mut buf);
        assert!(FromRunner::decode(k, body, None).is_err());
    }

    #[test]
    fn large_tensors_cross_in_shared_memory_and_their_regions_come_back() {
        let (front, fds) = FrontShm::create(4 << 20, Default::default()).expect("arenas");
        let runner = RunnerShm::map(fds.request, fds.response).expect("map");
        let request = ValidInferRequest {
            id: String::new(),
            parameters: Parameters::new(),
            priority: 0,
            timeout_us: 0,
            batch_size: 1,
            inputs: vec![Some(tensor("BIG", 2048)), Some(tensor("SMALL", 1))],
            outputs: vec![0],
            cuda: Default::default(),
            trace: Default::default(),
        };
        let big = request.inputs[0].as_ref().map(|t| t.data.clone()).expect("big");
        let mut buf = BytesMut::new();
        ToRunner::Infer(InferCall { key: "k".into(), version: 1, request }).encode(1, &mut buf, Some(&front));
        assert!(buf.len() < 4096, "the 128 KiB input is not in the frame ({} bytes)", buf.len());
        let (k, _, body) = one_frame(&mut buf);
        let ToRunner::Infer(call) = ToRunner::decode(k, body, Some(&runner)).expect("decodes") else { panic!() };
        let input = call.request.inputs[0].as_ref().expect("present");
        assert_eq!(input.data, big, "read in place, intact");
        assert_eq!(call.request.inputs[1].as_ref().map(|t| t.data.len()), Some(64));

        // The answer carries a large output through the response arena; the input's region
        // comes back with it once the runner dropped the request.
        drop(call);
        let out = OutputTensor { name: "OUT".into(), datatype: DataType::Int32, shape: vec![2048, 16], data: big };
        FromRunner::Answer { result: Ok(vec![out]), stats: Tally::default(), steps: Vec::new() }.encode(
            1,
            &mut buf,
            Some(&runner),
        );
        assert!(buf.len() < 4096);
        let (k, _, body) = one_frame(&mut buf);
        let FromRunner::Answer { result: Ok(outputs), .. } = FromRunner::decode(k, body, Some(&front)).expect("ok")
        else {
            panic!()
        };
        assert_eq!(outputs[0].data, tensor("x", 2048).data);
        assert!(!front.release(0), "the region already came back with the answer");
    }

    #[test]
    fn hostile_shared_memory_references_are_refused() {
        let (front, _fds) = FrontShm::create(1 << 20, Default::default()).expect("arenas");
        let answer = |body: &dyn Fn(&mut BytesMut)| {
            let mut buf = BytesMut::new();
            frame(&mut buf, kind::ANSWER_OK, 1, body);
            let (k, _, body) = one_frame(&mut buf);
            FromRunner::decode(k, body, Some(&front))
        };
        let output_at = |pos: u64, len: u64| {
            move |b: &mut BytesMut| {
                b.put_u32_le(0);
                put_tally(b, &Tally::default());
                put_steps(b, &[]);
                b.put_u32_le(1);
                put_str(b, "OUT");
                put_str(b, "UINT8");
                b.put_u32_le(1);
                b.put_i64_le(len as i64);
                b.put_u8(SHARED);
                b.put_u64_le(pos);
                b.put_u64_le(len);
            }
        };
        assert!(answer(&output_at(0, 1 << 20)).is_ok(), "a region inside the arena is read");
        let err = answer(&output_at((1 << 20) - 8, 16)).expect_err("past the end");
        assert!(err.0.contains("outside the shared memory"), "{err}");
        assert!(answer(&output_at(0, u64::MAX)).is_err());
        // Giving back a region the front never handed out.
        let err = answer(&|b: &mut BytesMut| {
            b.put_u32_le(1);
            b.put_u64_le(4096);
        })
        .expect_err("unknown region");
        assert!(err.0.contains("does not hold"), "{err}");
        // A shared reference where no shared memory is mapped.
        let mut buf = BytesMut::new();
        frame(&mut buf, kind::ANSWER_OK, 1, output_at(0, 64));
        let (k, _, body) = one_frame(&mut buf);
        assert!(FromRunner::decode(k, body, None).is_err());
    }

    fn cuda_ref(id: u64, offset: u64, byte_size: u64) -> CudaRef {
        let handle = IpcHandle(std::array::from_fn(|i| i as u8));
        let region = CudaRegionRef { id, name: format!("r{id}"), handle, device_id: 3, byte_size: 4096 };
        let lease = Some(Arc::new(crate::engine::cuda_ipc::CudaLease::new(id)));
        CudaRef { region: Arc::new(region), offset, byte_size, lease }
    }

    #[test]
    fn cuda_references_cross_without_their_bytes() {
        let mut input = tensor("IN", 2);
        input.data = Bytes::new();
        let cuda = CudaIo {
            inputs: vec![("IN".into(), cuda_ref(7, 128, 128))],
            outputs: vec![("OUT".into(), cuda_ref(8, 0, 4096))],
        };
        let request = ValidInferRequest {
            id: String::new(),
            parameters: Parameters::new(),
            priority: 0,
            timeout_us: 0,
            batch_size: 2,
            inputs: vec![Some(input)],
            outputs: vec![0],
            cuda,
            trace: Default::default(),
        };
        let mut buf = BytesMut::new();
        ToRunner::Infer(InferCall { key: "k".into(), version: 1, request }).encode(3, &mut buf, None);
        ToRunner::CudaRelease { id: 7 }.encode(0, &mut buf, None);
        let (k, _, body) = one_frame(&mut buf);
        let ToRunner::Infer(call) = ToRunner::decode(k, body, None).expect("decodes") else { panic!("not infer") };
        let cuda = &call.request.cuda;
        let (name, at) = &cuda.inputs[0];
        assert_eq!((name.as_str(), at.offset, at.byte_size, at.lease.is_none()), ("IN", 128, 128, true));
        assert_eq!(*at.region, *cuda_ref(7, 0, 0).region, "id, name, handle, device and size intact");
        assert_eq!(cuda.output("OUT").map(|r| (r.region.id, r.byte_size)), Some((8, 4096)));
        assert!(call.request.inputs[0].as_ref().is_some_and(|t| t.data.is_empty()));
        let (k, id, body) = one_frame(&mut buf);
        assert!(matches!(ToRunner::decode(k, body, None), Ok(ToRunner::CudaRelease { id: 7 })));
        assert_eq!(id, 0);

        // A window past its region's end is a malformed frame.
        let mut io = CudaIo::default();
        io.outputs.push(("OUT".into(), cuda_ref(9, 4000, 97)));
        let mut body = BytesMut::new();
        put_cuda_io(&mut body, &io);
        let e = Reader(body.freeze()).cuda_io().expect_err("outside");
        assert!(e.0.contains("outside its region"), "{e}");
    }

    #[test]
    fn an_output_written_to_cuda_comes_back_without_bytes() {
        let out = OutputTensor { name: "OUT".into(), datatype: DataType::Fp32, shape: vec![4], data: Bytes::new() };
        let mut buf = BytesMut::new();
        FromRunner::Answer { result: Ok(vec![out]), stats: Tally::default(), steps: Vec::new() }
            .encode(1, &mut buf, None);
        let (k, _, body) = one_frame(&mut buf);
        let FromRunner::Answer { result: Ok(outputs), .. } = FromRunner::decode(k, body, None).expect("ok") else {
            panic!()
        };
        assert!(outputs[0].data.is_empty());
    }

    #[test]
    fn every_error_kind_survives_the_trip() {
        for kind in KINDS {
            assert_eq!(error_kind(error_kind_code(kind)), Ok(kind));
        }
        assert!(error_kind(200).is_err());
    }
}
