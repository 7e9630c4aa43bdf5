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
//! The walk reads keys and varints and skips everything else (seeking where the source can),
//! so memory stays constant however large the model; only `ModelProto`, `GraphProto`,
//! `NodeProto` and `OperatorSetIdProto` are descended into. It proves the file is
//! well-formed, not that it runs.

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

/// Checks that `src`, `len` bytes long, holds exactly one well-formed ONNX `ModelProto`.
pub fn check_model(src: &mut impl Source, len: u64) -> Result<(), OnnxError> {
    let mut walker = Walker { src, pos: 0, len };
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
    Ok(())
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
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Model => "model",
            Kind::Graph => "graph",
            Kind::Node => "node",
            Kind::OpsetId => "opset_import",
        }
    }

    /// The wire type a known field must have, and the message it holds if the walk enters it.
    fn field(self, number: u64) -> Option<(Wire, Option<Kind>)> {
        use Wire::{Len, Varint};
        Some(match (self, number) {
            // ir_version, model_version.
            (Kind::Model, 1 | 5) => (Varint, None),
            (Kind::Model, 7) => (Len, Some(Kind::Graph)),
            (Kind::Model, 8) => (Len, Some(Kind::OpsetId)),
            // producer_name, producer_version, domain, doc_string, metadata_props,
            // training_info, functions.
            (Kind::Model, 2 | 3 | 4 | 6 | 14 | 20 | 25) => (Len, None),
            (Kind::Graph, 1) => (Len, Some(Kind::Node)),
            // name, initializer, doc_string, input, output, value_info, quantization_annotation,
            // sparse_initializer, metadata_props.
            (Kind::Graph, 2 | 5 | 10..=16) => (Len, None),
            // input, output, name, op_type, attribute, doc_string, domain, overload, metadata_props.
            (Kind::Node, 1..=9) => (Len, None),
            (Kind::OpsetId, 1) => (Len, None),
            (Kind::OpsetId, 2) => (Varint, None),
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

/// Fields found in one message that decide whether it is acceptable.
#[derive(Debug, Default)]
struct Seen {
    ir_version: bool,
    graph: bool,
    opset_import: bool,
    nodes: bool,
    outputs: bool,
    op_type: bool,
}

struct Walker<'a, S> {
    src: &'a mut S,
    pos: u64,
    len: u64,
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
                    if kind == Kind::Model && number == 1 {
                        if value == 0 {
                            return Err(invalid(format!("ir_version 0 at byte {at}")));
                        }
                        seen.ir_version = true;
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
                    match known.and_then(|(_, inner)| inner) {
                        Some(inner) => self.enter(inner, field_end)?,
                        None => self.skip(n, field_end)?,
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
    fn enter(&mut self, kind: Kind, end: u64) -> Result<(), OnnxError> {
        let at = self.pos;
        let seen = self.message(kind, end)?;
        match kind {
            Kind::Graph if !seen.nodes && !seen.outputs => {
                Err(invalid(format!("the graph at byte {at} has no nodes and no outputs")))
            }
            Kind::Node if !seen.op_type => Err(invalid(format!("the node at byte {at} has no op_type"))),
            _ => Ok(()),
        }
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
        let streamed = check_model(&mut Streamed::new(bytes), bytes.len() as u64).map_err(|e| e.to_string());
        let seeking = check_model(&mut Seeking::new(Cursor::new(bytes), bytes.len() as u64), bytes.len() as u64)
            .map_err(|e| e.to_string());
        assert_eq!(streamed, seeking, "both sources agree");
        streamed
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
