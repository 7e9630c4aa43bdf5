//! ONNX artifact checks: is an uploaded file a protobuf `ModelProto` at all?
//!
//! The control plane has no ONNX Runtime; a worker is the first to load a model. So that a
//! truncated file, random bytes or a text file never become a version, uploads are walked as
//! protobuf wire format before they are accepted: every field key and wire type valid, every
//! length-delimited field inside its message, the model ending exactly at the end of the
//! file, and the parts a loadable model has present (`ir_version`, `opset_import`, and a
//! `graph` that itself parses as a `GraphProto` with at least one node or output, each node
//! naming its `op_type`).
//!
//! The walk also learns the graph's interface ([`GraphIo`]): each input's and output's name and
//! declared type (element type and shape for tensors), leaving out inputs that are initializers
//! (ONNX Runtime does not ask for those). [`crate::signature`] turns it into what the registry
//! stores and refuses what no worker could serve.
//!
//! The walk reads keys and varints and skips everything else (seeking where the source can),
//! so memory stays bounded however large the model: only `ModelProto`, `GraphProto`,
//! `NodeProto`, `OperatorSetIdProto`, the graph's `ValueInfoProto`s (with their `TypeProto`s and
//! shapes) and the names of its initializers are descended into, and what is kept of them is
//! capped at [`MAX_KEPT_BYTES`]. It proves the file is well-formed, not that it runs.

use std::collections::HashSet;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Seek};

/// Why a file is not an ONNX model.
#[derive(Debug)]
pub enum OnnxError {
    /// The bytes are not a well-formed `ModelProto`; the message says where and how.
    Invalid(String),
    /// Reading the file failed (not the file's fault).
    Io(io::Error),
}

impl fmt::Display for OnnxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OnnxError::Invalid(m) => f.write_str(m),
            OnnxError::Io(e) => write!(f, "could not be read: {e}"),
        }
    }
}

fn invalid(message: String) -> OnnxError {
    OnnxError::Invalid(message)
}

/// Where the walker reads from: a byte at a time, and skips.
pub trait Source {
    /// The next byte, or `None` at the end of the input.
    fn next_byte(&mut self) -> io::Result<Option<u8>>;
    /// Skips `n` bytes; returns how many were there (fewer at the end of the input).
    fn skip(&mut self, n: u64) -> io::Result<u64>;
}

/// A source that can only be read forwards (an archive entry): skipping reads and discards.
pub struct Streamed<R>(BufReader<R>);

impl<R: Read> Streamed<R> {
    /// Wraps a reader.
    pub fn new(reader: R) -> Self {
        Streamed(BufReader::with_capacity(64 * 1024, reader))
    }
}

impl<R: Read> Source for Streamed<R> {
    fn next_byte(&mut self) -> io::Result<Option<u8>> {
        next_byte(&mut self.0)
    }

    fn skip(&mut self, n: u64) -> io::Result<u64> {
        io::copy(&mut (&mut self.0).take(n), &mut io::sink())
    }
}

/// A source that can seek (a stored object of known size): skipping costs nothing.
pub struct Seeking<R> {
    inner: BufReader<R>,
    pos: u64,
    len: u64,
}

impl<R: Read + Seek> Seeking<R> {
    /// Wraps a reader positioned at 0 over `len` bytes.
    pub fn new(reader: R, len: u64) -> Self {
        Seeking { inner: BufReader::with_capacity(64 * 1024, reader), pos: 0, len }
    }
}

impl<R: Read + Seek> Source for Seeking<R> {
    fn next_byte(&mut self) -> io::Result<Option<u8>> {
        let b = next_byte(&mut self.inner)?;
        self.pos += u64::from(b.is_some());
        Ok(b)
    }

    fn skip(&mut self, n: u64) -> io::Result<u64> {
        let n = n.min(self.len.saturating_sub(self.pos));
        // Within the file, so the offset fits an i64 (files are far below 2^63 bytes).
        let delta = i64::try_from(n).map_err(io::Error::other)?;
        self.inner.seek_relative(delta)?;
        self.pos += n;
        Ok(n)
    }
}

fn next_byte(r: &mut impl BufRead) -> io::Result<Option<u8>> {
    let b = r.fill_buf()?.first().copied();
    if b.is_some() {
        r.consume(1);
    }
    Ok(b)
}

/// The declared type of a graph input or output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValueType {
    /// A tensor of ONNX element type `elem_type` (`TensorProto.DataType`, 0 when not given),
    /// with its shape when declared: each dimension a size, or `None` (symbolic or unknown).
    Tensor {
        /// `TensorProto.DataType` number.
        elem_type: i64,
        /// Dimensions, if the graph declares a shape.
        shape: Option<Vec<Option<i64>>>,
    },
    /// A sequence (`seq(...)`, e.g. scikit-learn's ZipMap output: a sequence of maps).
    Sequence,
    /// A map.
    Map,
    /// A sparse tensor.
    SparseTensor,
    /// An optional value.
    Optional,
    /// No type declared, or one this walk does not know.
    Unknown,
}

/// A graph input or output as the model declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueInfo {
    /// Name in the graph.
    pub name: String,
    /// Declared type.
    pub ty: ValueType,
}

/// The graph's interface: what a client feeds and gets back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphIo {
    /// Inputs a request must (or may) feed, in graph order; initializers listed as inputs
    /// (older exporters do that) are left out.
    pub inputs: Vec<ValueInfo>,
    /// Outputs, in graph order.
    pub outputs: Vec<ValueInfo>,
}

/// Most bytes of names, dimensions and value infos the walk keeps: a model of millions of
/// inputs or initializers is refused rather than held in memory.
pub const MAX_KEPT_BYTES: u64 = 64 * 1024 * 1024;

/// Checks that `src`, `len` bytes long, holds exactly one well-formed ONNX `ModelProto`, and
/// returns its graph's interface.
pub fn check_model(src: &mut impl Source, len: u64) -> Result<GraphIo, OnnxError> {
    let mut walker = Walker { src, pos: 0, len, kept: 0 };
    let seen = walker.message(Kind::Model, len)?;
    // A source longer than it said (an archive entry that lies about its size) is not a model.
    if walker.src.next_byte().map_err(OnnxError::Io)?.is_some() {
        return Err(invalid(format!("trailing data after byte {len}")));
    }
    if !seen.ir_version {
        return Err(invalid("no ir_version (field 1)".into()));
    }
    if !seen.graph {
        return Err(invalid("no graph (field 7)".into()));
    }
    if !seen.opset_import {
        return Err(invalid("no opset_import (field 8)".into()));
    }
    Ok(seen.io)
}

/// The largest field number protobuf allows (2^29 - 1). Protobuf's own parsers, ONNX Runtime's
/// among them, refuse a key above it, so a file with one would never load on a worker.
const MAX_FIELD_NUMBER: u64 = (1 << 29) - 1;

/// The messages the walk descends into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Model,
    Graph,
    Node,
    OpsetId,
    /// A graph input's or output's `ValueInfoProto`.
    ValueInfo,
    /// `TypeProto`.
    Type,
    /// `TypeProto.Tensor`.
    TensorType,
    /// `TensorShapeProto`.
    Shape,
    /// `TensorShapeProto.Dimension`.
    Dim,
    /// An initializer's `TensorProto` (only its name is read).
    Tensor,
    /// A sparse initializer's `SparseTensorProto`.
    SparseTensor,
}

/// What the walk does with a known length-delimited field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Skip,
    Enter(Kind),
    /// Keep it as text (a name).
    Text,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Model => "model",
            Kind::Graph => "graph",
            Kind::Node => "node",
            Kind::OpsetId => "opset_import",
            Kind::ValueInfo => "value_info",
            Kind::Type => "type",
            Kind::TensorType => "tensor_type",
            Kind::Shape => "shape",
            Kind::Dim => "dim",
            Kind::Tensor => "tensor",
            Kind::SparseTensor => "sparse_tensor",
        }
    }

    /// The wire type a known field must have, and what the walk does with it.
    fn field(self, number: u64) -> Option<(Wire, Action)> {
        use Action::{Enter, Skip, Text};
        use Wire::{Len, Varint};
        Some(match (self, number) {
            // ir_version, model_version.
            (Kind::Model, 1 | 5) => (Varint, Skip),
            (Kind::Model, 7) => (Len, Enter(Kind::Graph)),
            (Kind::Model, 8) => (Len, Enter(Kind::OpsetId)),
            // producer_name, producer_version, domain, doc_string, metadata_props,
            // training_info, functions.
            (Kind::Model, 2 | 3 | 4 | 6 | 14 | 20 | 25) => (Len, Skip),
            (Kind::Graph, 1) => (Len, Enter(Kind::Node)),
            (Kind::Graph, 5) => (Len, Enter(Kind::Tensor)),
            (Kind::Graph, 11 | 12) => (Len, Enter(Kind::ValueInfo)),
            (Kind::Graph, 15) => (Len, Enter(Kind::SparseTensor)),
            // name, doc_string, value_info, quantization_annotation, metadata_props.
            (Kind::Graph, 2 | 10 | 13 | 14 | 16) => (Len, Skip),
            // input, output, name, op_type, attribute, doc_string, domain, overload, metadata_props.
            (Kind::Node, 1..=9) => (Len, Skip),
            (Kind::OpsetId, 1) => (Len, Skip),
            (Kind::OpsetId, 2) => (Varint, Skip),
            (Kind::ValueInfo, 1) => (Len, Text),
            (Kind::ValueInfo, 2) => (Len, Enter(Kind::Type)),
            // doc_string, metadata_props.
            (Kind::ValueInfo, 3 | 4) => (Len, Skip),
            (Kind::Type, 1) => (Len, Enter(Kind::TensorType)),
            // sequence_type, map_type, denotation, sparse_tensor_type, optional_type.
            (Kind::Type, 4 | 5 | 6 | 8 | 9) => (Len, Skip),
            (Kind::TensorType, 1) => (Varint, Skip),
            (Kind::TensorType, 2) => (Len, Enter(Kind::Shape)),
            (Kind::Shape, 1) => (Len, Enter(Kind::Dim)),
            (Kind::Dim, 1) => (Varint, Skip),
            // dim_param, denotation.
            (Kind::Dim, 2 | 3) => (Len, Skip),
            // Only the name: numeric data may be packed or not, so its wire type varies.
            (Kind::Tensor, 8) => (Len, Text),
            (Kind::SparseTensor, 1) => (Len, Enter(Kind::Tensor)),
            _ => return None,
        })
    }
}

/// Protobuf wire types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

impl Wire {
    fn of(bits: u64) -> Option<Wire> {
        match bits {
            0 => Some(Wire::Varint),
            1 => Some(Wire::Fixed64),
            2 => Some(Wire::Len),
            5 => Some(Wire::Fixed32),
            // 3 and 4 are proto2 groups (ONNX has none); 6 and 7 do not exist.
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Wire::Varint => "varint",
            Wire::Fixed64 => "64-bit",
            Wire::Len => "length-delimited",
            Wire::Fixed32 => "32-bit",
        }
    }
}

/// Fields found in one message: those that decide whether it is acceptable, and what it says
/// about the graph's interface (each kind of message fills its own).
#[derive(Debug, Default)]
struct Seen {
    ir_version: bool,
    graph: bool,
    opset_import: bool,
    nodes: bool,
    outputs: bool,
    op_type: bool,
    /// A value info's or tensor's name.
    name: Option<String>,
    /// A value info's type, or what a type is.
    ty: Option<ValueType>,
    /// A tensor type's element type.
    elem_type: Option<i64>,
    /// A tensor type's shape.
    shape: Option<Vec<Option<i64>>>,
    /// A shape's dimensions.
    dims: Vec<Option<i64>>,
    /// A dimension's size.
    dim: Option<i64>,
    /// The graph's inputs and outputs (a graph and the model holding it).
    io: GraphIo,
    /// A graph's initializer names.
    initializers: HashSet<String>,
}

/// Bytes a kept dimension or value info is counted as against [`MAX_KEPT_BYTES`].
const KEPT_DIM: u64 = 16;
const KEPT_VALUE: u64 = 64;

struct Walker<'a, S> {
    src: &'a mut S,
    pos: u64,
    len: u64,
    /// Bytes kept so far (names, dimensions, value infos).
    kept: u64,
}

impl<S: Source> Walker<'_, S> {
    /// Walks the fields of a `kind` message up to `end`, which must be reached exactly.
    fn message(&mut self, kind: Kind, end: u64) -> Result<Seen, OnnxError> {
        let mut seen = Seen::default();
        while self.pos < end {
            let at = self.pos;
            let key = self.varint(end)?;
            let (number, bits) = (key >> 3, key & 7);
            if number == 0 || number > MAX_FIELD_NUMBER {
                return Err(invalid(format!("invalid field number {number} at byte {at}")));
            }
            let wire = Wire::of(bits)
                .ok_or_else(|| invalid(format!("invalid wire type {bits} for field {number} at byte {at}")))?;
            let known = kind.field(number);
            if let Some((expected, _)) = known
                && expected != wire
            {
                return Err(invalid(format!(
                    "{} field {number} at byte {at} is {}, expected {}",
                    kind.name(),
                    wire.name(),
                    expected.name()
                )));
            }
            match wire {
                Wire::Varint => {
                    let value = self.varint(end)?;
                    match (kind, number) {
                        (Kind::Model, 1) if value == 0 => return Err(invalid(format!("ir_version 0 at byte {at}"))),
                        (Kind::Model, 1) => seen.ir_version = true,
                        // int32 and int64 fields are two's complement in a varint.
                        (Kind::TensorType, 1) => seen.elem_type = Some(value as i64),
                        (Kind::Dim, 1) => seen.dim = Some(value as i64).filter(|d| *d >= 0),
                        _ => {}
                    }
                }
                Wire::Fixed64 => self.skip(8, end)?,
                Wire::Fixed32 => self.skip(4, end)?,
                Wire::Len => {
                    let n = self.varint(end)?;
                    let start = self.pos;
                    let field_end = start
                        .checked_add(n)
                        .filter(|e| *e <= end)
                        .ok_or_else(|| self.overrun(kind, number, at, n, end))?;
                    match known.map_or(Action::Skip, |(_, action)| action) {
                        Action::Enter(inner) => {
                            let child = self.enter(inner, field_end)?;
                            self.fold(&mut seen, kind, number, child)?;
                        }
                        Action::Text => seen.name = Some(self.text(n, field_end)?),
                        Action::Skip => self.skip(n, field_end)?,
                    }
                    record(&mut seen, kind, number);
                }
            }
        }
        if self.pos != end {
            return Err(invalid(format!("a field runs past the end of the {} at byte {end}", kind.name())));
        }
        Ok(seen)
    }

    /// Walks an embedded message and checks what it must hold.
    fn enter(&mut self, kind: Kind, end: u64) -> Result<Seen, OnnxError> {
        let at = self.pos;
        let mut seen = self.message(kind, end)?;
        match kind {
            Kind::Graph if !seen.nodes && !seen.outputs => {
                Err(invalid(format!("the graph at byte {at} has no nodes and no outputs")))
            }
            Kind::Node if !seen.op_type => Err(invalid(format!("the node at byte {at} has no op_type"))),
            Kind::Graph => {
                // ONNX Runtime does not ask for an input that an initializer provides.
                let initializers = std::mem::take(&mut seen.initializers);
                seen.io.inputs.retain(|i| !initializers.contains(&i.name));
                Ok(seen)
            }
            _ => Ok(seen),
        }
    }

    /// Folds what an embedded message (`child`, field `number` of a `kind`) says into its parent.
    fn fold(&mut self, seen: &mut Seen, kind: Kind, number: u64, child: Seen) -> Result<(), OnnxError> {
        match (kind, number) {
            (Kind::Model, 7) => seen.io = child.io,
            (Kind::Graph, 5 | 15) => {
                if let Some(name) = child.name {
                    seen.initializers.insert(name);
                }
            }
            (Kind::Graph, 11 | 12) => {
                self.keep(KEPT_VALUE)?;
                let value =
                    ValueInfo { name: child.name.unwrap_or_default(), ty: child.ty.unwrap_or(ValueType::Unknown) };
                if number == 11 { seen.io.inputs.push(value) } else { seen.io.outputs.push(value) }
            }
            (Kind::SparseTensor, 1) => seen.name = child.name,
            (Kind::ValueInfo, 2) => seen.ty = child.ty,
            (Kind::Type, 1) => {
                seen.ty = Some(ValueType::Tensor { elem_type: child.elem_type.unwrap_or(0), shape: child.shape });
            }
            (Kind::TensorType, 2) => seen.shape = Some(child.dims),
            (Kind::Shape, 1) => {
                self.keep(KEPT_DIM)?;
                seen.dims.push(child.dim);
            }
            _ => {}
        }
        Ok(())
    }

    /// Counts `n` more bytes kept, refusing a model whose interface would take too much memory.
    fn keep(&mut self, n: u64) -> Result<(), OnnxError> {
        self.kept += n;
        if self.kept > MAX_KEPT_BYTES {
            return Err(invalid(format!(
                "the graph's names, inputs and outputs take more than {MAX_KEPT_BYTES} bytes (at byte {})",
                self.pos
            )));
        }
        Ok(())
    }

    /// Reads an `n`-byte string field ending by `end`.
    fn text(&mut self, n: u64, end: u64) -> Result<String, OnnxError> {
        let at = self.pos;
        self.keep(n)?;
        if self.pos + n > end {
            return Err(self.cut(end));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(4096));
        for _ in 0..n {
            let b = self.src.next_byte().map_err(OnnxError::Io)?.ok_or_else(|| self.truncated())?;
            self.pos += 1;
            bytes.push(b);
        }
        String::from_utf8(bytes).map_err(|_| invalid(format!("a name at byte {at} is not UTF-8")))
    }

    /// The error for a length-delimited field longer than what holds it.
    fn overrun(&self, kind: Kind, number: u64, at: u64, n: u64, end: u64) -> OnnxError {
        if end == self.len {
            let short = n.saturating_sub(end - self.pos);
            invalid(format!(
                "truncated at byte {}: {} field {number} at byte {at} needs {short} more bytes",
                self.len,
                kind.name()
            ))
        } else {
            invalid(format!(
                "{} field {number} at byte {at} is {n} bytes long, past the end of its message at byte {end}",
                kind.name()
            ))
        }
    }

    fn varint(&mut self, end: u64) -> Result<u64, OnnxError> {
        let at = self.pos;
        let mut value: u64 = 0;
        for i in 0..10 {
            if self.pos >= end {
                return Err(self.cut(end));
            }
            let b = self.src.next_byte().map_err(OnnxError::Io)?.ok_or_else(|| self.truncated())?;
            self.pos += 1;
            // The tenth byte may only carry the top bit of a 64-bit value.
            if i == 9 && b > 1 {
                return Err(invalid(format!("malformed varint at byte {at}")));
            }
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(invalid(format!("malformed varint at byte {at}")))
    }

    fn skip(&mut self, n: u64, end: u64) -> Result<(), OnnxError> {
        if self.pos + n > end {
            return Err(self.cut(end));
        }
        let skipped = self.src.skip(n).map_err(OnnxError::Io)?;
        self.pos += skipped;
        if skipped < n {
            return Err(self.truncated());
        }
        Ok(())
    }

    /// A value that does not fit before `end`: the file is short, or a message is malformed.
    fn cut(&self, end: u64) -> OnnxError {
        if end == self.len {
            invalid(format!("truncated at byte {}", self.len))
        } else {
            invalid(format!("a field runs past the end of its message at byte {end}"))
        }
    }

    /// The input ended before the length it was said to have.
    fn truncated(&self) -> OnnxError {
        invalid(format!("truncated at byte {} (the file was said to be {} bytes)", self.pos, self.len))
    }
}

/// Notes a length-delimited field that makes a message acceptable.
fn record(seen: &mut Seen, kind: Kind, number: u64) {
    match (kind, number) {
        (Kind::Model, 7) => seen.graph = true,
        (Kind::Model, 8) => seen.opset_import = true,
        (Kind::Type, 4) => seen.ty = Some(ValueType::Sequence),
        (Kind::Type, 5) => seen.ty = Some(ValueType::Map),
        (Kind::Type, 8) => seen.ty = Some(ValueType::SparseTensor),
        (Kind::Type, 9) => seen.ty = Some(ValueType::Optional),
        (Kind::Graph, 1) => seen.nodes = true,
        (Kind::Graph, 12) => seen.outputs = true,
        (Kind::Node, 4) => seen.op_type = true,
        _ => {}
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Cursor;

    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn len_field(number: u64, body: &[u8], out: &mut Vec<u8>) {
        varint(number << 3 | 2, out);
        varint(body.len() as u64, out);
        out.extend_from_slice(body);
    }

    /// A small but complete ONNX model (one Identity node), with `padding` bytes of
    /// `doc_string` so tests can make it any size.
    pub fn model(padding: usize) -> Vec<u8> {
        let mut node = Vec::new();
        len_field(1, b"x", &mut node);
        len_field(2, b"y", &mut node);
        len_field(4, b"Identity", &mut node);
        let mut graph = Vec::new();
        len_field(1, &node, &mut graph);
        len_field(2, b"g", &mut graph);
        len_field(11, &[0x0a, 0x01, b'x'], &mut graph);
        len_field(12, &[0x0a, 0x01, b'y'], &mut graph);
        let mut m = vec![0x08, 0x08]; // ir_version 8
        len_field(8, &[0x10, 0x0d], &mut m); // opset_import { version: 13 }
        // The graph goes last, so that every prefix of the model lacks something.
        if padding > 0 {
            len_field(6, &vec![b'z'; padding], &mut m);
        }
        len_field(7, &graph, &mut m);
        m
    }

    fn check(bytes: &[u8]) -> Result<(), String> {
        io_of(bytes).map(|_| ())
    }

    fn io_of(bytes: &[u8]) -> Result<GraphIo, String> {
        let streamed = check_model(&mut Streamed::new(bytes), bytes.len() as u64).map_err(|e| e.to_string());
        let seeking = check_model(&mut Seeking::new(Cursor::new(bytes), bytes.len() as u64), bytes.len() as u64)
            .map_err(|e| e.to_string());
        assert_eq!(streamed, seeking, "both sources agree");
        streamed
    }

    /// A `TypeProto` field body for a tensor of `elem_type` with `dims` (`None`: symbolic).
    pub fn tensor_type(elem_type: u64, dims: Option<&[Option<u64>]>) -> Vec<u8> {
        let mut tensor = Vec::new();
        varint(1 << 3, &mut tensor);
        varint(elem_type, &mut tensor);
        if let Some(dims) = dims {
            let mut shape = Vec::new();
            for d in dims {
                let mut dim = Vec::new();
                match d {
                    Some(n) => {
                        varint(1 << 3, &mut dim);
                        varint(*n, &mut dim);
                    }
                    None => len_field(2, b"batch", &mut dim),
                }
                len_field(1, &dim, &mut shape);
            }
            len_field(2, &shape, &mut tensor);
        }
        let mut ty = Vec::new();
        len_field(1, &tensor, &mut ty);
        ty
    }

    /// A `TypeProto` field body for a sequence of maps (scikit-learn's ZipMap output).
    pub fn zipmap_type() -> Vec<u8> {
        let mut map = Vec::new();
        varint(1 << 3, &mut map); // key_type: INT64
        varint(7, &mut map);
        len_field(2, &tensor_type(1, None), &mut map); // value_type: FLOAT
        let mut map_type = Vec::new();
        len_field(5, &map, &mut map_type);
        let mut sequence = Vec::new();
        len_field(1, &map_type, &mut sequence); // elem_type
        let mut ty = Vec::new();
        len_field(4, &sequence, &mut ty);
        ty
    }

    /// A `ValueInfoProto` body: a name and, if given, a `TypeProto` body.
    pub fn value_info(name: &str, ty: Option<&[u8]>) -> Vec<u8> {
        let mut v = Vec::new();
        len_field(1, name.as_bytes(), &mut v);
        if let Some(ty) = ty {
            len_field(2, ty, &mut v);
        }
        v
    }

    /// A model with these inputs and outputs (`ValueInfoProto` bodies), one node, and
    /// initializers named `initializers`.
    pub fn model_with(inputs: &[Vec<u8>], outputs: &[Vec<u8>], initializers: &[&str]) -> Vec<u8> {
        let mut node = Vec::new();
        len_field(4, b"Identity", &mut node);
        let mut graph = Vec::new();
        len_field(1, &node, &mut graph);
        for name in initializers {
            let mut tensor = vec![0x08, 0x02, 0x10, 0x01]; // dims [2], FLOAT
            tensor.extend_from_slice(&[0x22, 0x08, 0, 0, 0, 0, 0, 0, 0, 0]); // float_data, packed
            len_field(8, name.as_bytes(), &mut tensor);
            len_field(9, &[0; 8], &mut tensor); // raw_data after the name
            len_field(5, &tensor, &mut graph);
        }
        for i in inputs {
            len_field(11, i, &mut graph);
        }
        for o in outputs {
            len_field(12, o, &mut graph);
        }
        let mut m = vec![0x08, 0x08];
        len_field(8, &[0x10, 0x0d], &mut m);
        len_field(7, &graph, &mut m);
        m
    }

    #[test]
    fn the_graph_interface_is_read() {
        let input = value_info("x", Some(&tensor_type(1, Some(&[None, Some(4)]))));
        let weights = value_info("w", Some(&tensor_type(1, Some(&[Some(2)]))));
        let label = value_info("label", Some(&tensor_type(7, Some(&[None]))));
        let probabilities = value_info("probabilities", Some(&zipmap_type()));
        let untyped = value_info("y", None);
        let io = io_of(&model_with(&[input, weights], &[label, probabilities, untyped], &["w"])).unwrap();
        assert_eq!(
            io.inputs,
            [ValueInfo { name: "x".into(), ty: ValueType::Tensor { elem_type: 1, shape: Some(vec![None, Some(4)]) } }],
            "the initializer 'w' is no input a client feeds"
        );
        let outputs: Vec<(&str, &ValueType)> = io.outputs.iter().map(|o| (o.name.as_str(), &o.ty)).collect();
        assert_eq!(
            outputs,
            [
                ("label", &ValueType::Tensor { elem_type: 7, shape: Some(vec![None]) }),
                ("probabilities", &ValueType::Sequence),
                ("y", &ValueType::Unknown)
            ]
        );
        // No shape at all is not a scalar.
        let io = io_of(&model_with(&[value_info("s", Some(&tensor_type(8, None)))], &[], &[])).unwrap();
        assert_eq!(io.inputs[0].ty, ValueType::Tensor { elem_type: 8, shape: None });
        // The untyped test model reads as such.
        let io = io_of(&model(10)).unwrap();
        assert_eq!((io.inputs[0].name.as_str(), &io.outputs[0].ty), ("x", &ValueType::Unknown));
    }

    #[test]
    fn names_that_are_not_text_or_too_many_are_refused() {
        let bad = model_with(&[value_info("\u{fffd}", None)], &[], &[]);
        let bad: Vec<u8> = bad.iter().map(|b| if *b == 0xef { 0xff } else { *b }).collect();
        assert!(io_of(&bad).unwrap_err().contains("not UTF-8"));
        let mut walker_src = Streamed::new(&[][..]);
        let mut w = Walker { src: &mut walker_src, pos: 0, len: 0, kept: MAX_KEPT_BYTES };
        assert!(w.keep(1).unwrap_err().to_string().contains("more than"));
    }

    #[test]
    fn accepts_well_formed_models_of_any_size() {
        for padding in [0, 1, 200, 100_000] {
            assert_eq!(check(&model(padding)), Ok(()), "padding {padding}");
        }
        // Unknown fields of any valid wire type are fine (newer ONNX versions add fields).
        let mut m = model(0);
        m.extend_from_slice(&[0xf8, 0x01, 0x05]); // field 31, varint
        m.extend_from_slice(&[0xfd, 0x01, 1, 2, 3, 4]); // field 31, fixed32
        m.extend_from_slice(&[0xf9, 0x01, 1, 2, 3, 4, 5, 6, 7, 8]); // field 31, fixed64
        assert_eq!(check(&m), Ok(()));
    }

    #[test]
    fn refuses_field_numbers_protobuf_does_not_allow() {
        // Found by the `onnx` fuzz target: prost (like protobuf C++) refuses these keys.
        let with_field = |number: u64| {
            let mut m = model(0);
            varint(number << 3, &mut m);
            m.push(0x01);
            check(&m)
        };
        assert_eq!(with_field(MAX_FIELD_NUMBER), Ok(()));
        for number in [MAX_FIELD_NUMBER + 1, 1 << 32, u64::MAX >> 3] {
            assert!(with_field(number).unwrap_err().contains(&format!("invalid field number {number}")), "{number}");
        }
    }

    #[test]
    fn refuses_every_prefix_of_a_model() {
        let m = model(10);
        for cut in 0..m.len() {
            let e = check(&m[..cut]).expect_err(&format!("a {cut}-byte prefix"));
            assert!(e.contains("truncated") || e.starts_with("no "), "{cut}: {e}");
        }
        let e = check(&m[..20]).unwrap_err();
        assert!(e.starts_with("truncated at byte 20"), "{e}");
    }

    #[test]
    fn refuses_garbage_text_and_missing_parts() {
        let mut text = vec![0x08, 0x07];
        text.extend_from_slice(b"hello, this is not a model at all\n".repeat(30).as_slice());
        assert!(check(&text).is_err());
        assert!(check(b"").unwrap_err().contains("no ir_version"));
        assert!(check(&[0x00; 64]).unwrap_err().contains("field number 0"));
        assert!(check(b"PK\x03\x04rest").is_err());
        assert!(check(b"<html>").is_err());
        assert!(check(&[0x0f]).unwrap_err().contains("wire type 7"));
        assert!(check(&[0x0b, 0x0c]).unwrap_err().contains("wire type 3"));
        assert!(check(&[0x08, 0x08]).unwrap_err().contains("no graph"));
        // ir_version as a length-delimited field.
        assert!(check(&[0x0a, 0x00]).unwrap_err().contains("expected varint"));
        // A varint that never ends.
        assert!(
            check(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])
                .unwrap_err()
                .contains("malformed varint")
        );
        let mut no_opset = vec![0x08, 0x08];
        let graph: Vec<u8> = model(0).split_off(6);
        no_opset.extend_from_slice(&graph);
        assert!(check(&no_opset).unwrap_err().contains("no opset_import"), "{:?}", check(&no_opset));
        // An empty graph.
        let mut empty_graph = vec![0x08, 0x08, 0x42, 0x02, 0x10, 0x0d, 0x3a, 0x03, 0x12, 0x01, b'g'];
        assert!(check(&empty_graph).unwrap_err().contains("no nodes and no outputs"));
        // A node without op_type.
        empty_graph.truncate(6);
        empty_graph.extend_from_slice(&[0x3a, 0x05, 0x0a, 0x03, 0x0a, 0x01, b'x']);
        assert!(check(&empty_graph).unwrap_err().contains("no op_type"));
        // A field inside the graph that runs past the graph's end.
        let overrun = [0x08, 0x08, 0x42, 0x02, 0x10, 0x0d, 0x3a, 0x03, 0x12, 0x05, b'g', 0x00, 0x00, 0x00, 0x00];
        assert!(check(&overrun).unwrap_err().contains("past the end of its message"));
    }

    #[test]
    fn random_bytes_are_refused() {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..200 {
            let bytes: Vec<u8> = (0..4096)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            assert!(check(&bytes).is_err());
        }
    }

    #[test]
    fn a_source_longer_than_said_is_refused() {
        let mut m = model(0);
        let len = m.len() as u64;
        m.push(0);
        let e = check_model(&mut Streamed::new(m.as_slice()), len).unwrap_err();
        assert!(e.to_string().contains("trailing data"), "{e}");
    }
}
