//! NaN and ±Infinity in KServe JSON. JSON has no such numbers, but Triton reads and writes
//! them (rapidjson's `kParseNanAndInfFlag` / `kWriteNanAndInfFlag`), and so do Python's `json`
//! and tritonclient. This module owns that: it replaces each token in a request by a quoted
//! placeholder so that serde_json can parse the rest, remembers where each one went, reads
//! floating-point `data` arrays (the only place the tokens are allowed) with them, and writes
//! non-finite outputs as `NaN`, `Infinity` and `-Infinity`.

use std::borrow::Cow;

use serde_json::value::RawValue;
use tessera_protocol::DataType;

/// A request's JSON with every NaN/Infinity token outside strings replaced by a placeholder.
pub struct Prepared<'a> {
    /// What serde_json parses: the request itself when it has no such token.
    pub json: Cow<'a, [u8]>,
    /// The placeholders, in order of position in `json`.
    markers: Vec<Marker>,
}

/// One replaced token.
struct Marker {
    /// Offset of the placeholder's opening quote in [`Prepared::json`].
    at: usize,
    /// Offset of the token in the request, for messages.
    original: usize,
    /// The value the token stands for.
    value: f64,
}

/// Finds the tokens in `request` (rapidjson's forms, which include Python's: `NaN`, `Inf` and
/// `Infinity`, each optionally negative) and replaces each by a quoted placeholder; copies the
/// request only when it has one.
pub fn prepare(request: &[u8]) -> Prepared<'_> {
    let mut markers = Vec::new();
    let mut out = Vec::new();
    let (mut i, mut copied) = (0, 0);
    while i < request.len() {
        match request[i] {
            b'"' => i = string_end(request, i),
            // Outside strings these bytes start no valid JSON but a token, or (`-`) a number.
            b'N' | b'I' | b'-' => match token_at(&request[i..]) {
                Some((len, value)) => {
                    out.extend_from_slice(&request[copied..i]);
                    markers.push(Marker { at: out.len(), original: i, value });
                    out.extend_from_slice(placeholder(value).as_bytes());
                    i += len;
                    copied = i;
                }
                None => i += 1,
            },
            _ => i += 1,
        }
    }
    if markers.is_empty() {
        return Prepared { json: Cow::Borrowed(request), markers };
    }
    out.extend_from_slice(&request[copied..]);
    Prepared { json: Cow::Owned(out), markers }
}

/// The offset just past the string opening at `start` (the end of input if unterminated).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    bytes.len()
}

/// The token at the start of `rest`, with its length and value; `None` unless it ends where
/// a JSON value may end (so `NaNa` stays a syntax error).
fn token_at(rest: &[u8]) -> Option<(usize, f64)> {
    let negative = rest.first() == Some(&b'-');
    let body = &rest[usize::from(negative)..];
    let (len, magnitude) = if body.starts_with(b"NaN") {
        (3, f64::NAN)
    } else if body.starts_with(b"Infinity") {
        (8, f64::INFINITY)
    } else if body.starts_with(b"Inf") {
        (3, f64::INFINITY)
    } else {
        return None;
    };
    let len = len + usize::from(negative);
    let ends = rest.get(len).is_none_or(|b| matches!(b, b',' | b']' | b'}' | b' ' | b'\t' | b'\n' | b'\r'));
    ends.then_some((len, if negative { -magnitude } else { magnitude }))
}

/// The token Triton writes for a non-finite value.
fn token(value: f64) -> &'static str {
    match value {
        v if v.is_nan() => "NaN",
        v if v > 0.0 => "Infinity",
        _ => "-Infinity",
    }
}

/// The placeholder standing for a token: valid JSON, and readable in messages.
fn placeholder(value: f64) -> &'static str {
    match value {
        v if v.is_nan() => "\"NaN\"",
        v if v > 0.0 => "\"Infinity\"",
        _ => "\"-Infinity\"",
    }
}

impl Prepared<'_> {
    /// Where `raw`, parsed from [`Prepared::json`], starts in it.
    fn offset_of(&self, raw: &RawValue) -> Option<usize> {
        // serde_json borrows raw values from its input, so this is a position in `json`.
        let at = (raw.get().as_ptr() as usize).checked_sub(self.json.as_ptr() as usize)?;
        (at < self.json.len()).then_some(at)
    }

    /// Where `raw` starts, and the placeholders inside it.
    fn markers_in(&self, raw: &RawValue) -> (usize, &[Marker]) {
        let Some(start) = self.offset_of(raw) else { return (0, &[]) };
        let end = start + raw.get().len();
        let from = self.markers.partition_point(|m| m.at < start);
        let to = self.markers.partition_point(|m| m.at < end);
        (start, &self.markers[from..to])
    }

    /// Refuses a token outside every `data` value (in an id, a shape, parameters, unknown
    /// fields): only tensor data may hold one, as the placeholders would parse as strings.
    pub fn check_placement<'r>(&self, data: impl IntoIterator<Item = &'r RawValue>) -> Result<(), String> {
        if self.markers.is_empty() {
            return Ok(());
        }
        let mut ranges: Vec<(usize, usize)> =
            data.into_iter().filter_map(|raw| self.offset_of(raw).map(|at| (at, at + raw.get().len()))).collect();
        ranges.sort_unstable();
        let inside = |at: usize| {
            let i = ranges.partition_point(|r| r.0 <= at);
            i > 0 && at < ranges[i - 1].1
        };
        match self.markers.iter().find(|m| !inside(m.at)) {
            None => Ok(()),
            Some(m) => Err(format!(
                "{} at byte {} is not allowed there: NaN and Infinity may only appear in the 'data' of FP32 and FP64 inputs",
                token(m.value),
                m.original
            )),
        }
    }

    /// The first token inside `raw`, for refusing it in data of a type that has none.
    pub fn token_in(&self, raw: &RawValue) -> Option<&'static str> {
        self.markers_in(raw).1.first().map(|m| token(m.value))
    }

    /// Parses an FP32 or FP64 `data` value (flat or nested) straight into little-endian bytes;
    /// returns the number of elements.
    pub fn decode_floats(&self, raw: &RawValue, datatype: DataType, out: &mut Vec<u8>) -> Result<usize, String> {
        let (base, markers) = self.markers_in(raw);
        let text = raw.get();
        let bytes = text.as_bytes();
        let (mut i, mut count) = (0, 0);
        // `raw` is valid JSON (serde_json checked it), so brackets and commas need no checks.
        while i < bytes.len() {
            match bytes[i] {
                b'[' | b']' | b',' | b' ' | b'\t' | b'\n' | b'\r' => {
                    i += 1;
                    continue;
                }
                b'-' | b'0'..=b'9' => {
                    let end = bytes[i..].iter().position(|b| !is_number_byte(*b)).map_or(bytes.len(), |p| i + p);
                    push_number(&text[i..end], datatype, out)?;
                    i = end;
                }
                b'"' => {
                    let m = markers
                        .binary_search_by_key(&(base + i), |m| m.at)
                        .map(|k| &markers[k])
                        .map_err(|_| super::codec::wrong_kind(datatype))?;
                    push_value(m.value, datatype, out);
                    i += placeholder(m.value).len();
                }
                b't' | b'f' | b'n' | b'{' => return Err(super::codec::wrong_kind(datatype)),
                _ => return Err(format!("expected {datatype} data, got an unexpected character")),
            }
            count += 1;
        }
        Ok(count)
    }
}

fn is_number_byte(b: u8) -> bool {
    matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
}

/// Appends one JSON number; parsed at the element's own width so FP32 is rounded once, and
/// magnitudes past the type's range become ±Infinity, as IEEE rounding has it.
fn push_number(lexeme: &str, datatype: DataType, out: &mut Vec<u8>) -> Result<(), String> {
    let bad = |_| format!("invalid number {lexeme}");
    match datatype {
        DataType::Fp32 => out.extend(lexeme.parse::<f32>().map_err(bad)?.to_le_bytes()),
        _ => out.extend(lexeme.parse::<f64>().map_err(bad)?.to_le_bytes()),
    }
    Ok(())
}

fn push_value(value: f64, datatype: DataType, out: &mut Vec<u8>) {
    match datatype {
        DataType::Fp32 => out.extend((value as f32).to_le_bytes()),
        _ => out.extend(value.to_le_bytes()),
    }
}

/// Writes FP32 or FP64 little-endian `data` as a JSON array, non-finite values as Triton's
/// tokens (serde_json would write `null`, which clients read back as NaN or None).
pub fn write_floats(out: &mut Vec<u8>, datatype: DataType, data: &[u8]) -> serde_json::Result<()> {
    out.push(b'[');
    match datatype {
        DataType::Fp32 => write_all(out, data.chunks_exact(4).map(|c| f32::from_le_bytes(array(c)))),
        DataType::Fp64 => write_all(out, data.chunks_exact(8).map(|c| f64::from_le_bytes(array(c)))),
        other => return Err(serde::ser::Error::custom(format!("{other} is not a floating-point JSON type"))),
    }
    out.push(b']');
    Ok(())
}

fn array<const N: usize>(chunk: &[u8]) -> [u8; N] {
    chunk.try_into().expect("chunks_exact yields slices of the array's length")
}

fn write_all<T: zmij::Float + Into<f64> + Copy>(out: &mut Vec<u8>, values: impl Iterator<Item = T>) {
    // One formatting buffer for the whole array; the digits are serde_json's own (it formats
    // finite floats with this crate), without a serializer per value.
    let mut digits = zmij::Buffer::new();
    for (i, v) in values.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let wide: f64 = v.into();
        if wide.is_finite() {
            out.extend_from_slice(digits.format_finite(v).as_bytes());
        } else {
            out.extend_from_slice(token(wide).as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(json: &str) -> String {
        String::from_utf8(prepare(json.as_bytes()).json.into_owned()).expect("utf-8")
    }

    #[test]
    fn tokens_outside_strings_become_placeholders_and_strings_stay() {
        assert_eq!(prepared(r#"[NaN, -Infinity,Infinity]"#), r#"["NaN", "-Infinity","Infinity"]"#);
        assert_eq!(prepared("[Inf,-Inf,-NaN]"), r#"["Infinity","-Infinity","NaN"]"#);
        let untouched = r#"{"name":"NaN \" Infinity","data":[-1.5,2e3]}"#;
        assert!(matches!(prepare(untouched.as_bytes()).json, Cow::Borrowed(_)));
        // Not a token: left for serde_json to refuse.
        assert_eq!(prepared("[NaNa, Infinit, nan]"), "[NaNa, Infinit, nan]");
        assert!(serde_json::from_str::<serde_json::Value>(&prepared("[+Infinity]")).is_err(), "rapidjson has no +");
    }

    fn floats(json: &str, datatype: DataType) -> Result<Vec<u8>, String> {
        let p = prepare(json.as_bytes());
        let raw: &RawValue = serde_json::from_slice(&p.json).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        p.decode_floats(raw, datatype, &mut out)?;
        Ok(out)
    }

    #[test]
    fn float_data_reads_numbers_and_tokens_at_the_elements_width() {
        let out = floats("[[NaN, 1.5], [-Infinity, Infinity], [1e39, 16777217]]", DataType::Fp32).expect("fp32");
        let values: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes(array(c))).collect();
        assert!(values[0].is_nan());
        assert_eq!(&values[1..], &[1.5, f32::NEG_INFINITY, f32::INFINITY, f32::INFINITY, 16777216.0]);
        let out = floats("[-0.1, Inf, 1e400]", DataType::Fp64).expect("fp64");
        let values: Vec<f64> = out.chunks_exact(8).map(|c| f64::from_le_bytes(array(c))).collect();
        assert_eq!(values, [-0.1, f64::INFINITY, f64::INFINITY]);
    }

    #[test]
    fn float_data_refuses_what_is_not_a_number() {
        for (json, needle) in
            [(r#"["NaN"]"#, "non-number"), ("[true]", "non-number"), ("[null]", "non-number"), ("[{}]", "non-number")]
        {
            let e = floats(json, DataType::Fp32).expect_err(json);
            assert!(e.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn tokens_outside_data_are_refused_with_their_position() {
        let p = prepare(br#"{"id":NaN,"data":[Infinity]}"#);
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&p.json).expect("valid");
        assert_eq!(v["id"], "NaN", "the placeholder parses as a string");
        let whole: std::collections::HashMap<&str, &RawValue> = serde_json::from_slice(&p.json).expect("raw");
        let e = p.check_placement([whole["data"]]).expect_err("id");
        assert!(e.contains("NaN at byte 6") && e.contains("'data'"), "{e}");
        assert!(p.check_placement([whole["data"], whole["id"]]).is_ok());
        assert_eq!(p.token_in(whole["data"]), Some("Infinity"));
    }

    #[test]
    fn non_finite_outputs_are_written_as_triton_tokens() {
        let data: Vec<u8> =
            [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        write_floats(&mut out, DataType::Fp32, &data).expect("fp32");
        assert_eq!(String::from_utf8(out).expect("utf-8"), "[NaN,Infinity,-Infinity,0.1]");
        let data: Vec<u8> = [f64::NEG_INFINITY, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        write_floats(&mut out, DataType::Fp64, &data).expect("fp64");
        assert_eq!(String::from_utf8(out).expect("utf-8"), "[-Infinity,2.5]");
    }

    #[test]
    fn finite_floats_are_written_as_serde_json_writes_them() {
        // Bit patterns spread over every exponent (an xorshift walk), plus edge values.
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut singles: Vec<f32> =
            (0..5000).map(|_| f32::from_bits(next() as u32)).filter(|v| v.is_finite()).collect();
        singles.extend([0.0, -0.0, f32::MIN, f32::MAX, f32::MIN_POSITIVE, 1e-45, 16777217.0, 0.1, 3.0]);
        let mut doubles: Vec<f64> = (0..5000).map(|_| f64::from_bits(next())).filter(|v| v.is_finite()).collect();
        doubles.extend([0.0, -0.0, f64::MIN, f64::MAX, f64::MIN_POSITIVE, 5e-324, 0.1, 1e21, 1e-7]);
        let mut out = Vec::new();
        let data: Vec<u8> = singles.iter().flat_map(|v| v.to_le_bytes()).collect();
        write_floats(&mut out, DataType::Fp32, &data).expect("fp32");
        assert_eq!(String::from_utf8(out).expect("utf-8"), serde_json::to_string(&singles).expect("json"));
        let mut out = Vec::new();
        let data: Vec<u8> = doubles.iter().flat_map(|v| v.to_le_bytes()).collect();
        write_floats(&mut out, DataType::Fp64, &data).expect("fp64");
        assert_eq!(String::from_utf8(out).expect("utf-8"), serde_json::to_string(&doubles).expect("json"));
    }
}
