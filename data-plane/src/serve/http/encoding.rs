//! The request `Content-Encoding` check ahead of decompression: tower-http refuses a coding
//! it cannot undo with an empty 415, so this refuses it first, with a KServe JSON error.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// Codings the router's decompression layer undoes (its gzip and deflate features) or passes.
const ACCEPTED: [&str; 3] = ["gzip", "deflate", "identity"];

/// Middleware: passes a request without `Content-Encoding` or with one accepted coding
/// (lower-cased, which is how tower-http matches it; codings are case-insensitive); refuses
/// anything else with 501 and `Accept-Encoding`, as Triton does.
pub async fn check_content_encoding(mut request: Request) -> Result<Request, Response> {
    match accepted_coding(request.headers()) {
        Ok(None) => Ok(request),
        Ok(Some(coding)) => {
            request.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
            Ok(request)
        }
        Err(given) => {
            let message = format!("unsupported Content-Encoding '{given}'; accepted: gzip, deflate, identity");
            let mut response = Error::unsupported(message).into_response();
            response.headers_mut().insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip, deflate"));
            Err(response)
        }
    }
}

/// The request's one coding when it is accepted; what was sent when it is not (several
/// codings, or several headers, are not: the layer undoes only one).
fn accepted_coding(headers: &HeaderMap) -> Result<Option<&'static str>, String> {
    let mut values = headers.get_all(header::CONTENT_ENCODING).iter();
    let Some(first) = values.next() else { return Ok(None) };
    let text = String::from_utf8_lossy(first.as_bytes());
    let coding = ACCEPTED.iter().find(|c| c.eq_ignore_ascii_case(text.trim()));
    match (coding, values.next()) {
        (Some(coding), None) => Ok(Some(coding)),
        _ => {
            let all: Vec<String> = headers
                .get_all(header::CONTENT_ENCODING)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into())
                .collect();
            Err(all.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coding(values: &[&str]) -> Result<Option<&'static str>, String> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::CONTENT_ENCODING, HeaderValue::from_str(v).expect("header value"));
        }
        accepted_coding(&headers)
    }

    #[test]
    fn only_one_known_coding_passes() {
        assert_eq!(coding(&[]), Ok(None));
        assert_eq!(coding(&["gzip"]), Ok(Some("gzip")));
        assert_eq!(coding(&["Deflate "]), Ok(Some("deflate")));
        assert_eq!(coding(&["identity"]), Ok(Some("identity")));
        assert_eq!(coding(&["br"]), Err("br".into()));
        assert_eq!(coding(&["gzip, br"]), Err("gzip, br".into()));
        assert_eq!(coding(&["gzip", "gzip"]), Err("gzip, gzip".into()));
    }
}
