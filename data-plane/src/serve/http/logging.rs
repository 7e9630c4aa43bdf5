//! Triton's logging extension over HTTP: `GET` and `POST /v2/logging`. The settings are the
//! whole process's, so with authentication on only a platform admin reads or changes them.

use std::sync::Arc;

use axum::Json;
use serde_json::{Map, Value, json};

use super::Body;
use super::caller::Caller;
use super::handlers::{body_error, optional_object};
use crate::auth::Role;
use crate::error::Result;
use crate::logging::{self, LogSettings, LogUpdate, SettingValue};
use crate::serve::server::{ServerState, require_role};

/// `GET /v2/logging`.
pub async fn handle_log_settings(caller: Caller) -> Result<Json<Value>> {
    require_role(caller.principal(), Role::PlatformAdmin)?;
    Ok(Json(settings_json(&logging::settings())))
}

/// `POST /v2/logging`: applies the given settings and answers all of them.
pub async fn handle_update_log_settings(s: &Arc<ServerState>, caller: Caller, body: Body) -> Result<Json<Value>> {
    require_role(caller.principal(), Role::PlatformAdmin)?;
    let body = body.map_err(|e| body_error(e, s.max_input_size))?;
    let update = LogUpdate::parse(optional_object(&body)?.into_iter().map(|(k, v)| (k, setting_value(v))))?;
    Ok(Json(settings_json(&logging::update(&update)?)))
}

fn setting_value(value: Value) -> SettingValue {
    match value {
        Value::Bool(b) => SettingValue::Bool(b),
        Value::String(s) => SettingValue::Str(s),
        Value::Number(n) => match n.as_u64() {
            Some(n) => SettingValue::Uint(n),
            None => SettingValue::Other(n.to_string()),
        },
        other => SettingValue::Other(other.to_string()),
    }
}

fn settings_json(s: &LogSettings) -> Value {
    let mut map = Map::new();
    map.insert("log_file".into(), json!(s.file));
    map.insert("log_info".into(), json!(s.info));
    map.insert("log_warning".into(), json!(s.warning));
    map.insert("log_error".into(), json!(s.error));
    map.insert("log_verbose_level".into(), json!(s.verbose_level));
    map.insert("log_format".into(), json!(s.format.as_str()));
    Value::Object(map)
}
