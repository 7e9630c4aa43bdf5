//! The front ↔ runner wire protocol: frames split off a byte stream, then decoded.
//!
//! Input: a selector byte (even: frames a runner sent, decoded by the front; odd: frames the
//! front sent, decoded by a runner), then the stream. Frame splitting must take exactly the
//! length a frame declares or nothing; a runner frame the front accepts must encode back to the
//! very same bytes; a front frame, decoded, encoded and decoded again, must encode the same.
//! No shared memory is mapped, so tensors can only be inline.

use bytes::BytesMut;
use tessera_data_plane::runner::wire::{FromRunner, HEADER, MAX_FRAME, ToRunner, split_frame};

/// Splits and decodes `data` as a stream of frames.
pub fn run(data: &[u8]) {
    let Some((selector, stream)) = data.split_first() else { return };
    let from_runner = selector & 1 == 0;
    let mut buf = BytesMut::from(stream);
    let mut at = 0;
    loop {
        let before = buf.len();
        let declared = stream.get(at..at + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        match split_frame(&mut buf) {
            Ok(Some((kind, id, body))) => {
                let len = declared.expect("a frame has a length");
                assert_eq!(before - buf.len(), 4 + len, "a frame takes the length it declares");
                assert_eq!(HEADER + body.len(), 4 + len);
                let raw = &stream[at..at + 4 + len];
                assert_eq!(body, raw[HEADER..], "the body is the frame's tail");
                if from_runner {
                    check_from_runner(kind, id, raw);
                } else {
                    check_to_runner(kind, id, raw);
                }
                at += 4 + len;
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete frame is left in the buffer");
                assert!(declared.is_none_or(|len| before < 4 + len), "a whole frame is left in the buffer");
                return;
            }
            Err(_) => {
                let len = declared.expect("a refused frame has a length");
                assert!(!(HEADER - 4..=MAX_FRAME).contains(&len), "a frame of length {len} is refused");
                return;
            }
        }
    }
}

fn check_from_runner(kind: u8, id: u64, raw: &[u8]) {
    let Ok(answer) = FromRunner::decode(kind, bytes::Bytes::copy_from_slice(&raw[HEADER..]), None) else { return };
    let mut out = BytesMut::new();
    answer.encode(id, &mut out, None);
    assert_eq!(&out[..], raw, "a runner frame encodes back to other bytes: {answer:?}");
}

fn check_to_runner(kind: u8, id: u64, raw: &[u8]) {
    let Ok(call) = ToRunner::decode(kind, bytes::Bytes::copy_from_slice(&raw[HEADER..]), None) else { return };
    let mut first = BytesMut::new();
    call.encode(id, &mut first, None);
    let (kind, id, body) = split_frame(&mut first.clone()).expect("an encoded frame splits").expect("whole");
    let again = ToRunner::decode(kind, body, None).expect("an encoded call decodes");
    let mut second = BytesMut::new();
    again.encode(id, &mut second, None);
    assert_eq!(first, second, "a call changes on its second round trip: {call:?}");
}
