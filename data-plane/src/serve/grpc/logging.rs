//! Triton's logging extension over gRPC (`LogSettings`): the protocol's setting values to and
//! from the process's log settings.

use std::collections::HashMap;

use tessera_protocol::inference::log_settings_request::setting_value::ParameterChoice as In;
use tessera_protocol::inference::log_settings_response::SettingValue as OutValue;
use tessera_protocol::inference::log_settings_response::setting_value::ParameterChoice as Out;
use tessera_protocol::inference::{LogSettingsRequest, LogSettingsResponse};

use crate::error::Result;
use crate::logging::{self, LogSettings, LogUpdate, SettingValue};

/// Applies a request's settings (none: only reads them) and answers all of them.
pub fn log_settings(request: LogSettingsRequest) -> Result<LogSettingsResponse> {
    let settings = if request.settings.is_empty() {
        logging::settings()
    } else {
        let pairs = request.settings.into_iter().map(|(key, value)| {
            let value = match value.parameter_choice {
                Some(In::BoolParam(b)) => SettingValue::Bool(b),
                Some(In::Uint32Param(n)) => SettingValue::Uint(u64::from(n)),
                Some(In::StringParam(s)) => SettingValue::Str(s),
                None => SettingValue::Other("no value".into()),
            };
            (key, value)
        });
        logging::update(&LogUpdate::parse(pairs)?)?
    };
    Ok(LogSettingsResponse { settings: response_settings(&settings) })
}

fn response_settings(s: &LogSettings) -> HashMap<String, OutValue> {
    let value = |choice| OutValue { parameter_choice: Some(choice) };
    HashMap::from([
        ("log_file".to_string(), value(Out::StringParam(s.file.clone()))),
        ("log_info".to_string(), value(Out::BoolParam(s.info))),
        ("log_warning".to_string(), value(Out::BoolParam(s.warning))),
        ("log_error".to_string(), value(Out::BoolParam(s.error))),
        ("log_verbose_level".to_string(), value(Out::Uint32Param(s.verbose_level))),
        ("log_format".to_string(), value(Out::StringParam(s.format.as_str().to_string()))),
    ])
}
