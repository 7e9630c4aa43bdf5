//! The gateway's lean HTTP/1.1 path: a client's request head, a worker's answer head, and the
//! end of a chunked answer body (`tessera_data_plane::gateway::h1::head`).
//!
//! Input: a selector byte (0 mod 3: a request head; 1: an answer head; 2: a chunked body),
//! then the bytes. A head read whole lies within the bytes, its parts within the head; a
//! request head's body length is its one `Content-Length`. The end of a chunked body must be
//! found at the same offset whether the bytes come at once or one at a time, and an error
//! must be an error either way.

use tessera_data_plane::gateway::h1::head::{self, ChunkedEnd, Parsed};

/// Reads `data` as the selector says.
pub fn run(data: &[u8]) {
    let Some((selector, bytes)) = data.split_first() else { return };
    match selector % 3 {
        0 => request(bytes),
        1 => answer(bytes),
        _ => chunked(bytes),
    }
}

fn request(bytes: &[u8]) {
    let Parsed::Complete(head) = head::request(bytes) else { return };
    assert!(head.len <= bytes.len(), "the head lies within the bytes");
    assert!(bytes[head.target.clone()].starts_with(b"/"), "an origin-form target");
    assert!(head.target.end <= head.len);
    let mut lengths = Vec::new();
    for h in &head.headers {
        assert!(h.name.end <= head.len && h.value.end <= head.len, "headers lie within the head");
        if bytes[h.name.clone()].eq_ignore_ascii_case(b"content-length") {
            lengths.push(
                std::str::from_utf8(&bytes[h.value.clone()]).expect("digits").parse::<usize>().expect("a length"),
            );
        }
        let name = &bytes[h.name.clone()];
        for refused in ["transfer-encoding", "expect", "upgrade"] {
            assert!(!name.eq_ignore_ascii_case(refused.as_bytes()), "{refused} goes to hyper");
        }
    }
    assert!(lengths.iter().all(|n| *n == head.content_length), "one body length");
    if lengths.is_empty() {
        assert_eq!(head.content_length, 0, "no Content-Length, no body");
    }
}

fn answer(bytes: &[u8]) {
    let Ok(Some(head)) = head::response(bytes) else { return };
    assert!(head.len <= bytes.len(), "the head lies within the bytes");
    assert!(!head.status.is_informational(), "1xx is refused");
    for h in &head.headers {
        assert!(h.name.end <= head.len && h.value.end <= head.len, "headers lie within the head");
    }
    if head.framing == head::Framing::UntilClose {
        assert!(!head.keep_alive, "a body delimited by the close cannot keep the connection");
    }
}

fn chunked(bytes: &[u8]) {
    let whole = ChunkedEnd::default().advance(bytes);
    let mut scanner = ChunkedEnd::default();
    let mut piecewise = Ok(None);
    for (at, byte) in bytes.iter().enumerate() {
        match scanner.advance(std::slice::from_ref(byte)) {
            Ok(Some(end)) => {
                assert_eq!(end, 1, "a body ends within the byte that ends it");
                piecewise = Ok(Some(at + 1));
                break;
            }
            Ok(None) => {}
            Err(e) => {
                piecewise = Err(e);
                break;
            }
        }
    }
    match (&whole, &piecewise) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "the same end, at once or byte by byte"),
        (Err(_), Err(_)) => {}
        _ => panic!("at once {whole:?}, byte by byte {piecewise:?}"),
    }
    if let Ok(Some(end)) = whole {
        assert!(end <= bytes.len());
    }
}
