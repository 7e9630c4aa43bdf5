use super::*;

fn complete<T: std::fmt::Debug>(parsed: Parsed<T>) -> T {
    match parsed {
        Parsed::Complete(head) => head,
        other => panic!("expected a whole head, got {other:?}"),
    }
}

#[test]
fn a_model_request_head_is_read_as_offsets_into_its_bytes() {
    let bytes = b"POST /v2/models/m/infer?x=1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer k\r\n\
Content-Length: 4\r\nInference-Header-Content-Length: 2\r\nConnection: keep-alive, Close\r\n\r\n{}xx";
    let head = complete(request(bytes));
    assert_eq!(head.len, bytes.len() - 4);
    assert_eq!(head.method, http::Method::POST);
    assert_eq!(&bytes[head.target.clone()], b"/v2/models/m/infer?x=1");
    assert_eq!(head.content_length, 4);
    assert!(head.close, "close among the connection tokens");
    assert_eq!(&bytes[head.authorization.clone().expect("authorization")], b"Bearer k");
    assert_eq!(&bytes[head.json_length.clone().expect("json length")], b"2");
    let names: Vec<&[u8]> = head.headers.iter().map(|h| &bytes[h.name.clone()]).collect();
    assert_eq!(
        names,
        [&b"Host"[..], b"Authorization", b"Content-Length", b"Inference-Header-Content-Length", b"Connection"]
    );

    let get = complete(request(b"GET /v2/models/m HTTP/1.1\r\nHost: gw\r\n\r\n"));
    assert_eq!((get.method, get.content_length, get.close), (http::Method::GET, 0, false));
}

#[test]
fn a_head_not_all_there_is_partial_until_it_outgrows_the_limit() {
    assert!(matches!(request(b""), Parsed::Partial));
    assert!(matches!(request(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: g"), Parsed::Partial));
    let mut long = b"GET /v2/models/m HTTP/1.1\r\nx: ".to_vec();
    long.resize(MAX_HEAD_BYTES + 1, b'a');
    assert!(matches!(request(&long), Parsed::Other), "hyper answers a head too large");
}

#[test]
fn heads_this_path_does_not_serve_go_to_hyper() {
    for head in [
        "POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n",
        "GET /v2/models/m HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        "GET /v2/models/m HTTP/1.0\r\n\r\n",
        "PUT /v2/models/m HTTP/1.1\r\n\r\n",
        "HEAD /v2/models/m HTTP/1.1\r\n\r\n",
        "GET http://gw/v2/models/m HTTP/1.1\r\n\r\n",
        "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: -3\r\n\r\n",
        "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        "GET /v2/models/m HTTP/1.1\r\nbad header\r\n\r\n",
    ] {
        assert!(matches!(request(head.as_bytes()), Parsed::Other), "{head:?}");
    }
    let same_twice = "POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n";
    assert_eq!(complete(request(same_twice.as_bytes())).content_length, 3, "one length, given twice");
}

fn answer(bytes: &str) -> ResponseHead {
    response(bytes.as_bytes()).expect("valid head").expect("whole head")
}

#[test]
fn a_workers_answer_head_says_how_its_body_ends() {
    let fixed = answer("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n");
    assert_eq!((fixed.status, fixed.framing, fixed.keep_alive), (StatusCode::OK, Framing::Length(12), true));
    let chunked = answer("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
    assert_eq!(chunked.framing, Framing::Chunked);
    let unframed = answer("HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!((unframed.framing, unframed.keep_alive), (Framing::UntilClose, false));
    let other_coding = answer("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n");
    assert_eq!(other_coding.framing, Framing::UntilClose);
    let empty = answer("HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(empty.framing, Framing::Empty);
    let closing = answer("HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 2\r\n\r\n");
    assert_eq!((closing.status, closing.keep_alive), (StatusCode::NOT_FOUND, false));
    let old = answer("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n");
    assert!(!old.keep_alive, "HTTP/1.0 closes unless it says keep-alive");

    assert!(response(b"HTTP/1.1 200 OK\r\ncontent-le").expect("so far valid").is_none());
    for bad in [
        "HTTP/1.1 100 Continue\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        "HTTP/9 nope\r\n\r\n",
    ] {
        assert!(response(bad.as_bytes()).is_err(), "{bad:?}");
    }
}

#[test]
fn only_connection_headers_of_an_answer_are_hop_by_hop() {
    for name in ["Connection", "keep-alive", "Proxy-Connection", "upgrade"] {
        assert!(hop_by_hop(name.as_bytes()), "{name}");
    }
    for name in ["content-length", "transfer-encoding", "trailer", "content-type", "retry-after"] {
        assert!(!hop_by_hop(name.as_bytes()), "{name}");
    }
}

/// Feeds `body` to a scanner in pieces of `piece` bytes; where the body ended, as an offset.
fn end_of(body: &[u8], piece: usize) -> Result<Option<usize>, BadChunk> {
    let mut scanner = ChunkedEnd::default();
    let mut at = 0;
    for part in body.chunks(piece) {
        if let Some(end) = scanner.advance(part)? {
            return Ok(Some(at + end));
        }
        at += part.len();
    }
    Ok(None)
}

#[test]
fn the_end_of_a_chunked_body_is_found_however_it_arrives() {
    let body =
        b"5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\ngrpc-status: 0\r\ngrpc-message: ok\r\n\r\n";
    let next = b"HTTP/1.1 200 OK\r\n";
    let mut with_next = body.to_vec();
    with_next.extend_from_slice(next);
    for piece in [1, 2, 3, 7, body.len(), with_next.len()] {
        assert_eq!(end_of(&with_next, piece), Ok(Some(body.len())), "pieces of {piece}");
    }
    assert_eq!(end_of(b"0\r\n\r\n", 1), Ok(Some(5)), "an empty body");
    assert_eq!(end_of(b"A\r\n0123456789\r\n0\n\n", 4), Ok(Some(18)), "bare LFs");
    assert_eq!(end_of(&body[..body.len() - 1], 5), Ok(None), "not ended yet");
}

#[test]
fn a_broken_chunked_body_is_an_error() {
    for bad in [&b"x\r\n"[..], b"5\r\nhelloXX", b"0\r\n\rX", b"ffffffffffffffff\r\n"] {
        assert!(end_of(bad, 3).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
}
