//! A protobuf message's top-level fields, walked without decoding the message: the gateway
//! reads a unary call's model and sequence id from its first message and skips the tensors by
//! their length, never reading them.
//!
//! Every message the workers' decoder (prost) takes is walked, unknown groups (wire types 3
//! and 4) included, so the gateway never refuses as malformed a call its worker would serve.
//! A few it refuses are walked too (a field number 0, an over-long varint); the worker then
//! answers the client's mistake.

/// Deepest nesting of groups walked: above prost's recursion limit (100), so nothing prost
/// decodes is refused here.
const MAX_GROUP_DEPTH: usize = 128;

/// One top-level field of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field<'a> {
    /// Its field number.
    pub number: u64,
    /// Its contents when it is length-delimited (wire type 2: strings, bytes, messages).
    pub delimited: Option<&'a [u8]>,
    /// The field as encoded, its key included.
    pub encoded: &'a [u8],
}

/// A message that is not protobuf: a field cut short, a wire type that does not exist, or a
/// group left open or closed out of turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// The top-level fields of `message`, in order; after an `Err` the walk ends.
#[inline]
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { rest: message }
}

/// The iterator [`fields`] returns.
#[derive(Debug)]
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, Malformed>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let start = self.rest;
        Some(match field(&mut self.rest) {
            Some((number, delimited)) => {
                let encoded = &start[..start.len() - self.rest.len()];
                Ok(Field { number, delimited, encoded })
            }
            None => {
                self.rest = &[];
                Err(Malformed)
            }
        })
    }
}

/// Reads one field off `m`: its number, and its contents when length-delimited.
#[inline]
fn field<'a>(m: &mut &'a [u8]) -> Option<(u64, Option<&'a [u8]>)> {
    let key = varint(m)?;
    let delimited = match key & 7 {
        3 => {
            skip_group(m, key >> 3, 1)?;
            None
        }
        wire => value(m, wire)?,
    };
    Some((key >> 3, delimited))
}

/// Reads past a value of wire type `wire` other than a group's: a length-delimited value's
/// contents, `None` for the others; `None` outside for a wire type that has no value here (4
/// closes a group none opened; 6 and 7 do not exist) or a value cut short.
#[inline]
fn value<'a>(m: &mut &'a [u8], wire: u64) -> Option<Option<&'a [u8]>> {
    match wire {
        0 => {
            varint(m)?;
        }
        1 => *m = m.get(8..)?,
        2 => {
            let len = usize::try_from(varint(m)?).ok()?;
            let (contents, rest) = m.split_at_checked(len)?;
            *m = rest;
            return Some(Some(contents));
        }
        5 => *m = m.get(4..)?,
        _ => return None,
    }
    Some(None)
}

/// Reads past a group's fields and the end tag that closes group `number`, `depth` groups
/// deep. Rare (no field of the inference messages is a group), so kept out of line.
#[cold]
fn skip_group(m: &mut &[u8], number: u64, depth: usize) -> Option<()> {
    if depth > MAX_GROUP_DEPTH {
        return None;
    }
    loop {
        let key = varint(m)?;
        match key & 7 {
            4 => return (key >> 3 == number).then_some(()),
            3 => skip_group(m, key >> 3, depth + 1)?,
            wire => {
                value(m, wire)?;
            }
        }
    }
}

/// A base-128 varint, advancing `m` past it; at most ten bytes (bits past 64 are dropped).
#[inline]
fn varint(m: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, byte) in m.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *m = &m[i + 1..];
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key: field `number`, wire type `wire`.
    fn key(number: u64, wire: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut v = number << 3 | wire;
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
        out
    }

    fn walk(m: &[u8]) -> Result<Vec<Field<'_>>, Malformed> {
        fields(m).collect()
    }

    #[test]
    fn every_wire_type_is_walked_and_delimited_contents_are_handed_out() {
        let mut m = key(1, 2);
        m.extend_from_slice(b"\x03mlp");
        let varint_at = m.len();
        m.extend(key(7, 0));
        m.extend_from_slice(&[0xff, 0xff, 0x01]);
        m.extend(key(8, 1));
        m.extend_from_slice(&[9; 8]);
        m.extend(key(9, 5));
        m.extend_from_slice(&[9; 4]);
        m.extend(key(300, 2));
        m.extend_from_slice(b"\x00");
        let fields = walk(&m).expect("well formed");
        let numbers: Vec<u64> = fields.iter().map(|f| f.number).collect();
        assert_eq!(numbers, [1, 7, 8, 9, 300]);
        assert_eq!(fields[0].delimited, Some(&b"mlp"[..]));
        assert_eq!(fields[0].encoded, &m[..varint_at]);
        assert_eq!(fields[1].delimited, None);
        assert_eq!(fields[4].delimited, Some(&b""[..]));
        let total: usize = fields.iter().map(|f| f.encoded.len()).sum();
        assert_eq!(total, m.len(), "the fields cover the message");
    }

    #[test]
    fn unknown_groups_nested_or_not_are_skipped_whole() {
        // Field 5 a group holding a string, a varint and a nested group 6; then field 1.
        let mut m = key(5, 3);
        m.extend(key(1, 2));
        m.extend_from_slice(b"\x02hi");
        m.extend(key(2, 0));
        m.push(1);
        m.extend(key(6, 3));
        m.extend(key(6, 4));
        m.extend(key(5, 4));
        m.extend(key(1, 2));
        m.extend_from_slice(b"\x01m");
        let fields = walk(&m).expect("well formed");
        assert_eq!(fields.len(), 2);
        assert_eq!((fields[0].number, fields[0].delimited), (5, None));
        assert_eq!((fields[1].number, fields[1].delimited), (1, Some(&b"m"[..])));
    }

    #[test]
    fn malformed_messages_end_the_walk_with_an_error() {
        let open = key(5, 3);
        let mut wrong_end = key(5, 3);
        wrong_end.extend(key(6, 4));
        let stray_end = key(5, 4);
        let mut too_deep = Vec::new();
        for _ in 0..=MAX_GROUP_DEPTH {
            too_deep.extend(key(5, 3));
        }
        for _ in 0..=MAX_GROUP_DEPTH {
            too_deep.extend(key(5, 4));
        }
        let cases: [(&str, Vec<u8>); 9] = [
            ("a group left open", open),
            ("a group closed by another's end", wrong_end),
            ("an end with no group", stray_end),
            ("groups nested too deep", too_deep),
            ("wire type 6", key(1, 6)),
            ("wire type 7", key(1, 7)),
            ("a string longer than the message", [key(1, 2), vec![5, b'a']].concat()),
            ("a fixed64 cut short", [key(1, 1), vec![0; 7]].concat()),
            ("a varint of eleven bytes", vec![0xff; 11]),
        ];
        for (what, m) in cases {
            let mut walked = fields(&m);
            let last = walked.by_ref().last();
            assert_eq!(last, Some(Err(Malformed)), "{what}");
            assert_eq!(walked.next(), None, "{what}: the walk ended");
        }
        let mut nested = Vec::new();
        for _ in 0..MAX_GROUP_DEPTH {
            nested.extend(key(5, 3));
        }
        for _ in 0..MAX_GROUP_DEPTH {
            nested.extend(key(5, 4));
        }
        assert!(walk(&nested).is_ok(), "groups nested to the limit are walked");
    }
}
