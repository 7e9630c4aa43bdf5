//! Triton's trace extension over HTTP: `GET` and `POST /v2/trace/setting` and
//! `/v2/models/{model}/trace/setting`. The settings are the whole server's, so with
//! authentication on only a platform admin reads or changes them.

use std::sync::Arc;

use axum::Json;
use serde_json::{Map, Value};

use super::Body;
use super::caller::Caller;
use super::handlers::{body_error, optional_object};
use crate::auth::Role;
use crate::error::{Error, Result};
use crate::serve::server::{ServerState, require_role};
use crate::trace::settings::{self, Update};

/// `GET /v2[/models/{model}]/trace/setting`.
pub async fn handle_trace_settings(s: &Arc<ServerState>, caller: Caller, model: Option<String>) -> Result<Json<Value>> {
    require_role(caller.principal(), Role::PlatformAdmin)?;
    let model = s.trace_model(model.as_deref())?;
    Ok(Json(settings_json(s, model)))
}

/// `POST /v2[/models/{model}]/trace/setting`: applies the given settings and answers all of
/// them.
pub async fn handle_update_trace_settings(
    s: &Arc<ServerState>,
    caller: Caller,
    model: Option<String>,
    body: Body,
) -> Result<Json<Value>> {
    require_role(caller.principal(), Role::PlatformAdmin)?;
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    let model = s.trace_model(model.as_deref())?;
    let pairs = optional_object(&body)?.into_iter().map(|(k, v)| setting_value(&k, v).map(|v| (k, v)));
    let update = Update::parse(pairs.collect::<Result<Vec<_>>>()?)?;
    s.tracer().update(model, &update)?;
    Ok(Json(settings_json(s, model)))
}

/// A JSON value as the settings take it: `null` clears; `trace_level` is an array of strings,
/// every other key a string, as Triton reads them (Triton answers other types with a 500).
fn setting_value(key: &str, value: Value) -> Result<settings::Value> {
    let strings = |items: &[Value]| items.iter().map(|v| v.as_str().map(str::to_string)).collect::<Option<Vec<_>>>();
    match (key, value) {
        (_, Value::Null) => Ok(None),
        ("trace_level", Value::Array(items)) => strings(&items)
            .map(Some)
            .ok_or_else(|| Error::invalid("trace setting 'trace_level' must be an array of strings")),
        ("trace_level", other) => {
            Err(Error::invalid(format!("trace setting 'trace_level' must be an array of strings, got {other}")))
        }
        (_, Value::String(s)) => Ok(Some(vec![s])),
        (key, other) => Err(Error::invalid(format!("trace setting '{key}' must be a string, got {other}"))),
    }
}

fn settings_json(s: &ServerState, model: Option<&str>) -> Value {
    let mut map = Map::new();
    for (key, mut values) in s.tracer().listed(model) {
        let value = match key {
            "trace_level" => Value::from(values),
            _ => Value::String(values.pop().unwrap_or_default()),
        };
        map.insert(key.to_string(), value);
    }
    Value::Object(map)
}
