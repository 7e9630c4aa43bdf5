//! Page cursors: opaque tokens the server issues in `next_cursor` and reads back. A cursor
//! names its list and a position in it; anything else (a guessed name, a number, a cursor of
//! another list) is refused with 400 instead of being used as a query bound.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::error::{Error, Result};
use crate::types::Name;

/// Longest cursor read (a key is at most about 100 characters; this leaves room).
const MAX_CURSOR_LEN: usize = 256;

/// The cursor for `position` in `list`.
pub fn encode(list: &str, position: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{list}:{position}"))
}

/// The position a cursor of `list` names.
fn decode(list: &str, cursor: &str) -> Result<String> {
    let bad =
        || Error::Malformed { field: "cursor", message: format!("cursor is not a next_cursor of this {list} list") };
    if cursor.len() > MAX_CURSOR_LEN {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(bytes).map_err(|_| bad())?;
    let position = text.strip_prefix(list).and_then(|t| t.strip_prefix(':')).ok_or_else(bad)?;
    Ok(position.to_string())
}

/// A page of `items` in the order of `key` (sorted here, so the order and the cursor agree
/// whatever order the registry returned): the first `limit` items after the one the cursor
/// names, and the cursor of the next page when there is one. For lists small enough to read
/// whole (a tenant's keys, users, deployments, aliases; tenants; workers).
pub fn page<T>(
    mut items: Vec<T>,
    list: &str,
    key: impl Fn(&T) -> String,
    cursor: Option<&str>,
    limit: i64,
) -> Result<(Vec<T>, Option<String>)> {
    let after = cursor.map(|c| decode(list, c)).transpose()?;
    items.sort_by_cached_key(&key);
    let start = after.map_or(0, |a| items.partition_point(|i| key(i) <= a));
    let limit = usize::try_from(limit).unwrap_or(0);
    let more = items.len().saturating_sub(start) > limit;
    let page: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    let next = if more { page.last().map(|i| encode(list, &key(i))) } else { None };
    Ok((page, next))
}

/// The model name a models-list cursor names.
pub fn decode_name(list: &str, cursor: &str) -> Result<Name> {
    let position = decode(list, cursor)?;
    Name::parse(&position).map_err(|_| Error::Malformed {
        field: "cursor",
        message: format!("cursor is not a next_cursor of this {list} list"),
    })
}

/// The number a numbered list's cursor names (a version or a sequence number, at least 0).
pub fn decode_number(list: &str, cursor: &str) -> Result<i64> {
    let position = decode(list, cursor)?;
    match position.parse::<i64>() {
        Ok(n) if n >= 0 && position == n.to_string() => Ok(n),
        _ => Err(Error::Malformed {
            field: "cursor",
            message: format!("cursor is not a next_cursor of this {list} list"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_strangers_are_refused() {
        let c = encode("models", "resnet-50");
        assert_eq!(decode_name("models", &c).unwrap().as_str(), "resnet-50");
        assert_eq!(decode_number("versions", &encode("versions", "7")).unwrap(), 7);
        let strangers = [
            "resnet".to_string(),
            "zzz".to_string(),
            "7".to_string(),
            String::new(),
            "%%%".to_string(),
            "x".repeat(1000),
            encode("versions", "resnet"),
            encode("models", "../x"),
            encode("models", "Robert'); DROP TABLE models;--"),
        ];
        for s in &strangers {
            let e = decode_name("models", s).unwrap_err();
            assert_eq!(
                (e.kind(), e.body().error.field.as_deref()),
                (crate::error::ErrorKind::BadRequest, Some("cursor")),
                "{s}"
            );
        }
        for n in ["-1", "07", "1e3", "x", "99999999999999999999"] {
            assert!(decode_number("versions", &encode("versions", n)).is_err(), "{n}");
        }
    }

    #[test]
    fn pages_walk_a_list_once_in_key_order() {
        let items: Vec<String> = ["b", "a-1", "a.2", "c", "a_3"].iter().map(|s| s.to_string()).collect();
        let key = |s: &String| s.clone();
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let (page, next) = page(items.clone(), "things", key, cursor.as_deref(), 2).unwrap();
            assert!(page.len() <= 2);
            seen.extend(page);
            match next {
                Some(n) => cursor = Some(n),
                None => break,
            }
        }
        let mut sorted = items.clone();
        sorted.sort();
        assert_eq!(seen, sorted);
        // Exactly a full page: no cursor to an empty page.
        assert_eq!(page(items.clone(), "things", key, None, 5).unwrap().1, None);
        // Another list's cursor is refused.
        let other = encode("models", "a");
        assert!(page(items, "things", key, Some(&other), 2).is_err());
    }
}
