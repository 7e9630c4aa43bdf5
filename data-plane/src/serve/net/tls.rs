//! TLS of the data plane's listeners: the shared acceptor and flags (see
//! [`tessera_protocol::tls`]), for [`crate::serve::http::serve`], the gRPC listener and any other
//! role's listeners (the gateway's).

pub use tessera_protocol::tls::{CaArgs, CertFiles, TlsAcceptor, TlsArgs, TlsError};
