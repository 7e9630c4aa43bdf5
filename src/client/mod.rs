//! The `tessera` client verbs for people and scripts, over the control plane's REST API `/v1`
//! and a worker's or gateway's KServe v2 endpoint: `login`, `whoami`, `models`, `versions`,
//! `aliases`, `deploy`, `deployments`, `keys`, `webhooks`, `usage`, `invoice` and `infer`.
//!
//! Each verb resolves its [`settings::Settings`] (flags, then `TESSERA_*` variables, then the config
//! file `tessera login` writes), makes its calls through [`api::ApiClient`], prints through
//! [`output`] (tables, or the API's JSON with `--output json`), and fails with one line naming
//! the HTTP status, the API's message and what to do next.

pub mod aliases;
pub mod api;
pub mod billing;
pub mod confirm;
pub mod deploy;
pub mod deployments;
pub mod infer;
pub mod keys;
pub mod login;
pub mod models;
pub mod output;
pub mod progress;
pub mod settings;
pub mod versions;
pub mod webhooks;
pub mod whoami;
