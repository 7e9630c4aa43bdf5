//! Tools beside serving: the raw ONNX Runtime benchmark (`tessera bench ort`), the plain TCP
//! relay the gateway is measured against (`tessera bench relay`) and the builder of the small
//! ONNX models that tests and `tessera dev` write.

pub mod bench;
pub mod onnx_builder;
pub mod relay;
