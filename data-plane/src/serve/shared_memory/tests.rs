use std::sync::atomic::{AtomicU32, Ordering};

use super::tensors::{self, ShmInput, ShmRef};
use super::*;
use crate::auth::Role;
use crate::engine::infer::{InferRequest, InferResponse, ParamValue, Parameters, RequestedOutput};
use crate::engine::tensor::{InputTensor, OutputTensor};

/// A POSIX shared memory object a test creates, as a client would; unlinked on drop.
struct Object {
    key: String,
    file: File,
}

impl Object {
    /// Creates `/<prefix>tessera-test-<pid>-<n>` of `len` bytes, filled with `fill`.
    pub fn new(prefix: &str, len: usize, fill: u8) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let key = format!("/{prefix}tessera-test-{}-{n}", std::process::id());
        let c_key = CString::new(key.clone()).expect("no NUL");
        // SAFETY: a NUL-terminated name that outlives the call.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        assert!(fd >= 0, "shm_open {key}: {}", std::io::Error::last_os_error());
        // SAFETY: just opened, owned by nobody else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.write_all_at(&vec![fill; len], 0).expect("fill the object");
        Self { key, file }
    }

    fn bytes(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.file.read_exact_at(&mut out, offset).expect("read back");
        out
    }

    fn truncate(&self, len: u64) {
        self.file.set_len(len).expect("truncate");
    }
}

impl Drop for Object {
    fn drop(&mut self) {
        let c_key = CString::new(self.key.clone()).expect("no NUL");
        // SAFETY: as in `new`.
        unsafe { libc::shm_unlink(c_key.as_ptr()) };
    }
}

fn tenant(name: &str) -> Principal {
    Principal { tenant_id: format!("id-{name}"), tenant_name: name.into(), role: Role::Inference }
}

fn serve() -> SharedMemory {
    SharedMemory::new(ShmPolicy::serve(true))
}

fn worker(max_regions: usize, max_bytes: u64) -> SharedMemory {
    SharedMemory::new(ShmPolicy::worker(true, TenantLimits { max_regions, max_bytes }))
}

#[test]
fn registered_regions_are_listed_read_and_written_within_their_window() {
    let object = Object::new("", 4096, 7);
    let shm = serve();
    shm.register(None, "in", &object.key, 16, 64).expect("register");
    shm.register(None, "all", &object.key, 0, 4096).expect("a second region on the same object");
    let status = shm.status(None, None).expect("status");
    assert_eq!(status.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["all", "in"]);
    assert_eq!(shm.status(None, Some("in")).expect("one")[0].offset, 16);

    let region = shm.get(None, "in").expect("known");
    region.write(8, &[1, 2, 3]).expect("write");
    assert_eq!(object.bytes(24, 3), [1, 2, 3], "offsets are relative to the region");
    assert_eq!(region.read(7, 5).expect("read"), [7, 1, 2, 3, 7]);
    let e = region.read(64, 1).expect_err("past the end");
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::InvalidArg, "Invalid offset for shared memory region: 'in'"));
    let e = region.read(60, 8).expect_err("runs past the end");
    assert_eq!(e.message, "Invalid offset + byte size for shared memory region: 'in'");
    assert_eq!(region.read(0, u64::MAX).expect_err("overflow").kind, ErrorKind::InvalidArg);
}

#[test]
fn registration_errors_are_tritons() {
    let object = Object::new("", 128, 0);
    let shm = serve();
    shm.register(None, "r", &object.key, 0, 128).expect("register");
    let e = shm.register(None, "r", &object.key, 0, 8).expect_err("taken");
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::AlreadyExists, "shared memory region 'r' already in manager"));
    let e = shm.register(None, "x", "/tessera-test-no-such-object", 0, 8).expect_err("missing");
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::Internal, "Unable to open shared memory region: '/tessera-test-no-such-object'")
    );
    for (offset, size) in [(0, 129), (100, 29), (128, 1), (u64::MAX, 2), (0, 0)] {
        let e = shm.register(None, "x", &object.key, offset, size).expect_err("out of range");
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::InvalidArg, "failed to register shared memory region 'x': invalid args"),
            "{offset}+{size}"
        );
    }
    assert_eq!(shm.register(None, "", &object.key, 0, 8).expect_err("no name").kind, ErrorKind::InvalidArg);
    let e = shm.status(None, Some("x")).expect_err("unknown");
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::NotFound, "Unable to find system shared memory region: 'x'"));
    let e = shm.get(None, "x").expect_err("unknown");
    assert_eq!(e.message, "Unable to find shared memory region: 'x'");
}

#[test]
fn unregistering_frees_the_name_and_spares_requests_that_hold_the_region() {
    let object = Object::new("", 64, 5);
    let shm = serve();
    shm.register(None, "a", &object.key, 0, 64).expect("a");
    shm.register(None, "b", &object.key, 0, 32).expect("b");
    let held = shm.get(None, "a").expect("a request resolved it");
    shm.unregister(None, Some("a")).expect("unregister");
    shm.unregister(None, Some("a")).expect("an unknown name is no error, as in Triton");
    assert_eq!(shm.get(None, "a").expect_err("gone").kind, ErrorKind::NotFound);
    assert_eq!(held.read(0, 4).expect("the request still reads it"), [5; 4]);
    held.write(60, &[9; 4]).expect("and writes it");
    shm.register(None, "a", &object.key, 0, 8).expect("the name is free again");
    shm.unregister(None, None).expect("all");
    assert!(shm.status(None, None).expect("status").is_empty());
}

#[test]
fn a_shrunken_object_fails_the_request_instead_of_the_server() {
    let object = Object::new("", 8192, 1);
    let shm = serve();
    shm.register(None, "r", &object.key, 4096, 4096).expect("register");
    object.truncate(4100);
    let region = shm.get(None, "r").expect("known");
    let e = region.read(0, 4096).expect_err("short");
    assert!(e.message.contains("smaller than when it was registered"), "{}", e.message);
}

#[test]
fn disabled_shared_memory_answers_as_triton_does() {
    let object = Object::new("", 64, 0);
    let shm = SharedMemory::new(ShmPolicy::serve(false));
    for e in [
        shm.register(None, "r", &object.key, 0, 8).expect_err("register"),
        shm.unregister(None, None).expect_err("unregister"),
        shm.get(None, "r").expect_err("use"),
    ] {
        assert_eq!(e.kind, ErrorKind::Unsupported);
        assert!(e.message.starts_with("Client shared memory is disabled."), "{}", e.message);
    }
    assert!(shm.status(None, None).expect("status still answers").is_empty());
}

#[test]
fn tenants_have_separate_name_spaces_and_only_their_own_keys() {
    let (acme, acme_b) = (tenant("acme"), tenant("acme-b"));
    let own = Object::new("acme:", 256, 3);
    let theirs = Object::new("acme-b:", 256, 4);
    let host = Object::new("", 256, 0);
    let shm = worker(8, 1 << 20);
    shm.register(Some(&acme), "r", &own.key, 0, 256).expect("own key");
    for key in [&theirs.key, &host.key, "/acme:", "/acme"] {
        let e = shm.register(Some(&acme), "x", key, 0, 8).expect_err(key);
        assert_eq!(e.kind, ErrorKind::InvalidArg, "{key}");
        assert!(e.message.contains("must start with '/acme:'"), "{}", e.message);
    }
    // acme-b cannot see, use or unregister acme's region, and may use the same name.
    assert!(shm.status(Some(&acme_b), None).expect("status").is_empty());
    assert_eq!(shm.status(Some(&acme_b), Some("r")).expect_err("unseen").kind, ErrorKind::NotFound);
    assert_eq!(shm.get(Some(&acme_b), "r").expect_err("unusable").kind, ErrorKind::NotFound);
    shm.unregister(Some(&acme_b), Some("r")).expect("as if it did not exist");
    shm.unregister(Some(&acme_b), None).expect("all of none");
    shm.register(Some(&acme_b), "r", &theirs.key, 0, 256).expect("acme-b's own 'r'");
    assert_eq!(shm.get(Some(&acme), "r").expect("still there").read(0, 1).expect("read"), [3]);
    assert_eq!(shm.get(Some(&acme_b), "r").expect("its own").read(0, 1).expect("read"), [4]);
    assert!(shm.status(None, None).expect("the serve name space").is_empty());
}

#[test]
fn tenant_caps_refuse_more_regions_and_bytes() {
    let acme = tenant("acme");
    let object = Object::new("acme:", 4096, 0);
    let shm = worker(2, 3000);
    shm.register(Some(&acme), "a", &object.key, 0, 1000).expect("a");
    let e = shm.register(Some(&acme), "b", &object.key, 0, 2001).expect_err("bytes");
    assert_eq!(e.kind, ErrorKind::TooManyRequests);
    assert!(e.message.contains("--client-shm-max-mib"), "{}", e.message);
    shm.register(Some(&acme), "b", &object.key, 0, 2000).expect("b fits exactly");
    let e = shm.register(Some(&acme), "c", &object.key, 0, 1).expect_err("regions");
    assert!(e.message.contains("--client-shm-max-regions"), "{}", e.message);
    shm.unregister(Some(&acme), Some("b")).expect("unregister");
    shm.register(Some(&acme), "c", &object.key, 0, 2000).expect("room again");
    let other = tenant("globex");
    let theirs = Object::new("globex:", 4096, 0);
    shm.register(Some(&other), "a", &theirs.key, 0, 3000).expect("caps are per tenant");
}

fn params(pairs: &[(&str, ParamValue)]) -> Parameters {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

#[test]
fn tensor_parameters_parse_with_tritons_rules() {
    let region = || (tensors::REGION, ParamValue::Str("r".into()));
    let p = params(&[region(), (tensors::BYTE_SIZE, ParamValue::Int(64)), (tensors::OFFSET, ParamValue::Uint(8))]);
    assert_eq!(tensors::parse(&p, "x").expect("valid"), Some(ShmRef { region: "r".into(), offset: 8, byte_size: 64 }));
    let p = params(&[region(), (tensors::BYTE_SIZE, ParamValue::Int(4))]);
    assert_eq!(tensors::parse(&p, "x").expect("offset defaults to 0").map(|r| r.offset), Some(0));
    assert_eq!(tensors::parse(&params(&[("binary_data", ParamValue::Bool(true))]), "x").expect("none"), None);
    let cases = [
        (params(&[region()]), "'shared_memory_byte_size' must be specified along with 'shared_memory_region'"),
        (params(&[(tensors::OFFSET, ParamValue::Int(0))]), "'shared_memory_offset' can not be specified without"),
        (params(&[(tensors::BYTE_SIZE, ParamValue::Int(4))]), "'shared_memory_byte_size' can not be specified without"),
        (
            params(&[(tensors::REGION, ParamValue::Int(1)), (tensors::BYTE_SIZE, ParamValue::Int(4))]),
            "invalid value type for 'shared_memory_region' parameter for tensor 'x'",
        ),
        (
            params(&[region(), (tensors::BYTE_SIZE, ParamValue::Int(-4))]),
            "invalid value type for 'shared_memory_byte_size'",
        ),
        (
            params(&[region(), (tensors::BYTE_SIZE, ParamValue::Int(4)), (tensors::OFFSET, ParamValue::Double(0.5))]),
            "invalid value type for 'shared_memory_offset'",
        ),
    ];
    for (p, words) in cases {
        let e = tensors::parse(&p, "x").expect_err(words);
        assert!(e.message.contains(words), "{words}: {}", e.message);
    }
}

fn shm_params(region: &str, offset: u64, byte_size: u64) -> Parameters {
    params(&[
        (tensors::REGION, ParamValue::Str(region.into())),
        (tensors::OFFSET, ParamValue::Uint(offset)),
        (tensors::BYTE_SIZE, ParamValue::Uint(byte_size)),
    ])
}

fn output(name: &str, data: Vec<u8>) -> OutputTensor {
    OutputTensor {
        name: name.into(),
        datatype: tessera_protocol::DataType::Uint8,
        shape: vec![data.len() as i64],
        data: data.into(),
    }
}

#[tokio::test]
async fn requests_read_inputs_and_write_outputs_through_regions() {
    let object = Object::new("", 64, 0);
    object.file.write_all_at(&[1, 2, 3, 4], 8).expect("input bytes");
    let shm = serve();
    shm.register(None, "io", &object.key, 0, 64).expect("register");
    let input = InputTensor {
        name: "x".into(),
        datatype: tessera_protocol::DataType::Uint8,
        shape: vec![4],
        data: Default::default(),
    };
    let mut request = InferRequest {
        inputs: vec![input],
        outputs: vec![
            RequestedOutput { name: "y".into(), parameters: shm_params("io", 32, 8) },
            RequestedOutput { name: "z".into(), parameters: Parameters::new() },
        ],
        ..Default::default()
    };
    let inputs = vec![ShmInput { index: 0, at: ShmRef { region: "io".into(), offset: 8, byte_size: 4 } }];
    let outputs = tensors::resolve(&shm, None, &mut request, inputs).await.expect("resolve").expect("an output in shm");
    assert_eq!(request.inputs[0].data.as_ref(), [1, 2, 3, 4]);
    shm.unregister(None, None).expect("unregistered while the request runs");

    let mut response = InferResponse {
        model_name: "m".into(),
        model_version: "1".into(),
        id: String::new(),
        outputs: vec![output("y", vec![9; 6]), output("z", vec![8; 2])],
    };
    outputs.write(&mut response).await.expect("written");
    assert_eq!(object.bytes(32, 8), [9, 9, 9, 9, 9, 9, 0, 0]);
    assert!(response.outputs[0].data.is_empty(), "the bytes went to the region");
    assert_eq!(response.outputs[1].data.as_ref(), [8, 8], "other outputs keep theirs");
    assert_eq!(outputs.find("y").map(|r| r.byte_size), Some(8));

    let mut too_big = InferResponse { outputs: vec![output("y", vec![1; 9])], ..response };
    let e = outputs.write(&mut too_big).await.expect_err("too big");
    assert_eq!(e.kind, ErrorKind::Internal);
    assert_eq!(
        e.message,
        "shared memory size specified with the request for output 'y' (8 bytes) should be at least 9 bytes to hold \
         the results"
    );
}

#[tokio::test]
async fn requests_without_shared_memory_resolve_to_nothing() {
    let shm = SharedMemory::new(ShmPolicy::serve(false));
    let mut request = InferRequest {
        outputs: vec![RequestedOutput { name: "y".into(), parameters: Parameters::new() }],
        ..Default::default()
    };
    assert!(tensors::resolve(&shm, None, &mut request, Vec::new()).await.expect("nothing to do").is_none());
    let inputs = vec![ShmInput { index: 0, at: ShmRef { region: "r".into(), offset: 0, byte_size: 4 } }];
    let e = tensors::resolve(&shm, None, &mut request, inputs).await.expect_err("disabled");
    assert_eq!(e.kind, ErrorKind::Unsupported);
}
