//! The engine: the model repository, the model manager and its loaded versions, their dynamic
//! batchers and instance threads, the ONNX Runtime backend, tensors, requests and statistics,
//! and the CUDA IPC copies of the process that runs a model.
//! It serves no network and knows no worker; the serving layer and the worker drive it.

pub mod backend;
pub mod batcher;
pub mod classification;
pub mod cuda_ipc;
pub mod device;
pub mod ensemble;
pub mod in_flight;
pub mod infer;
pub mod load_error;
pub mod manager;
pub mod model;
pub mod model_spec;
pub mod priority;
pub mod ragged;
pub mod repository;
pub mod response_cache;
pub mod sequence;
pub mod stats;
pub mod tensor;
pub mod warmup;
