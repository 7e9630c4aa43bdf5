//! The `tessera` client verbs for people and scripts: `login`, `models push`, `deploy`,
//! `deployments list|get` and `infer`, over the control plane's REST API `/v1` and a
//! worker's KServe v2 endpoint.
//!
//! Each verb resolves its [`settings::Settings`] (flags, then `TESSERA_*` variables, then the config
//! file `tessera login` writes), makes its calls through [`api::ApiClient`], and fails with one
//! line naming the HTTP status and the API's message.

pub mod api;
pub mod deploy;
pub mod infer;
pub mod login;
pub mod models;
pub mod progress;
pub mod settings;
