//! Triton's trace extension over gRPC (`TraceSetting`): the protocol's value lists to and from
//! the server's trace settings. An empty value list clears a key, as JSON `null` does over HTTP.

use std::collections::HashMap;

use tessera_protocol::inference::trace_setting_response::SettingValue;
use tessera_protocol::inference::{TraceSettingRequest, TraceSettingResponse};

use crate::error::Result;
use crate::serve::server::ServerState;
use crate::trace::settings::Update;

/// Applies a request's settings (none: only reads them) to the global scope or the named
/// model's, and answers all of that scope's settings.
pub fn trace_setting(state: &ServerState, request: TraceSettingRequest) -> Result<TraceSettingResponse> {
    let model = (!request.model_name.is_empty()).then_some(request.model_name.as_str());
    let model = state.trace_model(model)?;
    if !request.settings.is_empty() {
        let pairs = request.settings.into_iter().map(|(key, value)| (key, Some(value.value)));
        state.tracer().update(model, &Update::parse(pairs)?)?;
    }
    let settings: HashMap<String, SettingValue> =
        state.tracer().listed(model).into_iter().map(|(k, value)| (k.to_string(), SettingValue { value })).collect();
    Ok(TraceSettingResponse { settings })
}
