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
    Principal { tenant_id: format!("id-{name}"), tenant_name: name.into(), role: Role::Inference, key_id: None }
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
    shm.unregister(None, Kind::System, Some("a")).expect("unregister");
    shm.unregister(None, Kind::System, Some("a")).expect("an unknown name is no error, as in Triton");
    assert_eq!(shm.get(None, "a").expect_err("gone").kind, ErrorKind::NotFound);
    assert_eq!(held.read(0, 4).expect("the request still reads it"), [5; 4]);
    held.write(60, &[9; 4]).expect("and writes it");
    shm.register(None, "a", &object.key, 0, 8).expect("the name is free again");
    shm.unregister(None, Kind::System, None).expect("all");
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
        shm.unregister(None, Kind::System, None).expect_err("unregister"),
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
    shm.unregister(Some(&acme_b), Kind::System, Some("r")).expect("as if it did not exist");
    shm.unregister(Some(&acme_b), Kind::System, None).expect("all of none");
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
    shm.unregister(Some(&acme), Kind::System, Some("b")).expect("unregister");
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
    shm.unregister(None, Kind::System, None).expect("unregistered while the request runs");

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

// ---------------------------------------------------------------------------------------------
// CUDA regions. This machine has no CUDA, so registration stops at the driver check; the
// registry's rules are tested with entries put in place as a successful registration would.

use crate::engine::cuda_ipc::{self, CudaCloser, IpcHandle};

/// Enters a CUDA region for `caller` as `register_cuda` does once CUDA accepted it.
fn fake_cuda(shm: &SharedMemory, caller: Option<&Principal>, name: &str, byte_size: u64) -> Result<()> {
    let id = shm.next_cuda_id.fetch_add(1, Ordering::Relaxed);
    let info =
        Arc::new(CudaRegionRef { id, name: name.into(), handle: IpcHandle([id as u8; 64]), device_id: 2, byte_size });
    let cuda = CudaRegion { info, lease: Arc::new(CudaLease::new(id)) };
    shm.insert(owner_of(caller), Region { name: name.into(), kind: RegionKind::Cuda(cuda) })
}

fn in_runners() -> SharedMemory {
    SharedMemory::new(ShmPolicy::serve(true).with_models_in_runners(true))
}

#[tokio::test]
async fn cuda_registration_checks_its_arguments_before_cuda() {
    let object = Object::new("", 64, 0);
    let shm = serve();
    shm.register(None, "sys", &object.key, 0, 64).expect("a system region");
    let handle = IpcHandle([1; 64]);
    let cases = [
        ("", 0, 8, ErrorKind::InvalidArg, "'region name' is necessary to register cuda shared memory region"),
        ("c", 0, 0, ErrorKind::InvalidArg, "failed to register shared memory region 'c': invalid args"),
        ("c", -1, 8, ErrorKind::InvalidArg, "failed to register CUDA shared memory region: 'c', invalid device id -1"),
        ("sys", 0, 8, ErrorKind::AlreadyExists, "shared memory region 'sys' already in manager"),
    ];
    for (name, device, size, kind, message) in cases {
        let e = shm.register_cuda(None, name, handle, device, size).await.expect_err(message);
        assert_eq!((e.kind, e.message.as_str()), (kind, message));
    }
    let off = SharedMemory::new(ShmPolicy::serve(false));
    let e = off.register_cuda(None, "c", handle, 0, 8).await.expect_err("disabled");
    assert!(e.message.starts_with("Client shared memory is disabled."), "{}", e.message);
    assert!(!off.cuda_allowed());
}

#[tokio::test]
async fn without_cuda_registration_fails_cleanly_and_registers_nothing() {
    if cuda_ipc::library().is_ok() {
        return; // a machine with a driver: the GPU smoke test covers registration
    }
    let worker = worker(8, 1 << 20);
    for (shm, caller) in [(serve(), None), (in_runners(), None), (worker, Some(tenant("acme")))] {
        let e = shm.register_cuda(caller.as_ref(), "c", IpcHandle([1; 64]), 0, 64).await.expect_err("no CUDA");
        assert_eq!(e.kind, ErrorKind::InvalidArg);
        assert_eq!(
            e.message,
            "failed to register CUDA shared memory region: 'c', GPUs not supported: CUDA is not available on this \
             server (libcuda.so.1 not found)"
        );
        assert!(shm.cuda_status(caller.as_ref(), None).expect("status").is_empty());
        assert!(!shm.cuda_allowed(), "not advertised");
    }
}

#[test]
fn cuda_and_system_regions_share_names_but_not_status_or_unregister() {
    let object = Object::new("", 256, 0);
    let shm = serve();
    shm.register(None, "sys", &object.key, 0, 256).expect("system");
    fake_cuda(&shm, None, "gpu", 1024).expect("cuda");
    let e = shm.register(None, "gpu", &object.key, 0, 8).expect_err("one name space");
    assert_eq!(e.message, "shared memory region 'gpu' already in manager");
    assert_eq!(fake_cuda(&shm, None, "sys", 8).expect_err("both ways").kind, ErrorKind::AlreadyExists);

    assert_eq!(shm.status(None, None).expect("system").iter().map(|r| &r.name).collect::<Vec<_>>(), ["sys"]);
    let cuda = shm.cuda_status(None, None).expect("cuda");
    assert_eq!(cuda, [CudaRegionStatus { name: "gpu".into(), device_id: 2, byte_size: 1024 }]);
    assert_eq!(shm.cuda_status(None, Some("gpu")).expect("one"), cuda);
    let e = shm.status(None, Some("gpu")).expect_err("other kind");
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::NotFound, "The region named 'gpu' is registered as CUDA shared memory, not system shared memory")
    );
    let e = shm.cuda_status(None, Some("sys")).expect_err("other kind");
    assert_eq!(e.message, "The region named 'sys' is registered as system shared memory, not CUDA shared memory");
    let e = shm.cuda_status(None, Some("nope")).expect_err("unknown");
    assert_eq!((e.kind, e.message.as_str()), (ErrorKind::NotFound, "Unable to find cuda shared memory region: 'nope'"));

    // Unregistering one kind leaves the other alone, by name or all at once (Triton's rule).
    shm.unregister(None, Kind::System, Some("gpu")).expect("no error");
    shm.unregister(None, Kind::System, None).expect("all system regions");
    assert_eq!(shm.cuda_status(None, None).expect("cuda").len(), 1);
    shm.register(None, "sys", &object.key, 0, 256).expect("system again");
    shm.unregister(None, Kind::Cuda, Some("sys")).expect("no error");
    shm.unregister(None, Kind::Cuda, None).expect("all CUDA regions");
    assert!(shm.cuda_status(None, None).expect("cuda").is_empty());
    assert_eq!(shm.status(None, None).expect("system").len(), 1);
    assert_eq!(shm.get(None, "gpu").expect_err("gone").kind, ErrorKind::NotFound);
}

#[test]
fn cuda_regions_belong_to_their_tenant_and_count_against_its_caps() {
    let (acme, globex) = (tenant("acme"), tenant("globex"));
    let shm = worker(2, 4096);
    fake_cuda(&shm, Some(&acme), "g", 4000).expect("acme's");
    assert!(shm.cuda_status(Some(&globex), None).expect("status").is_empty());
    assert_eq!(shm.cuda_status(Some(&globex), Some("g")).expect_err("unseen").kind, ErrorKind::NotFound);
    assert_eq!(shm.get(Some(&globex), "g").expect_err("unusable").kind, ErrorKind::NotFound);
    shm.unregister(Some(&globex), Kind::Cuda, None).expect("all of none");
    fake_cuda(&shm, Some(&globex), "g", 4096).expect("globex's own 'g'");
    let e = fake_cuda(&shm, Some(&acme), "h", 97).expect_err("bytes");
    assert!(e.message.contains("--client-shm-max-mib"), "{}", e.message);
    let own = Object::new("acme:", 64, 0);
    shm.register(Some(&acme), "s", &own.key, 0, 64).expect("a system region fits");
    let e = fake_cuda(&shm, Some(&acme), "h", 1).expect_err("regions");
    assert!(e.message.contains("--client-shm-max-regions"), "{}", e.message);
}

/// Counts the close notices a "runner" gets.
#[derive(Default)]
struct Notices(parking_lot::Mutex<Vec<u64>>);

impl CudaCloser for Notices {
    fn close(&self, id: u64) {
        self.0.lock().push(id);
    }
}

fn cuda_input(name: &str, bytes: usize) -> InputTensor {
    InputTensor {
        name: name.into(),
        datatype: tessera_protocol::DataType::Uint8,
        shape: vec![bytes as i64],
        data: Default::default(),
    }
}

#[tokio::test]
async fn with_models_in_runners_requests_carry_cuda_references_and_runners_hear_when_they_go() {
    let object = Object::new("", 64, 0);
    let shm = in_runners();
    fake_cuda(&shm, None, "gin", 256).expect("cuda in");
    fake_cuda(&shm, None, "gout", 256).expect("cuda out");
    shm.register(None, "sys", &object.key, 0, 64).expect("system out");
    let mut request = InferRequest {
        inputs: vec![cuda_input("x", 16)],
        outputs: vec![
            RequestedOutput { name: "y".into(), parameters: shm_params("gout", 128, 64) },
            RequestedOutput { name: "z".into(), parameters: shm_params("sys", 0, 8) },
        ],
        ..Default::default()
    };
    let inputs = vec![ShmInput { index: 0, at: ShmRef { region: "gin".into(), offset: 32, byte_size: 16 } }];
    let outputs = tensors::resolve(&shm, None, &mut request, inputs).await.expect("resolve").expect("outputs");
    assert!(request.inputs[0].data.is_empty(), "the runner copies it");
    let at = request.cuda.input("x").expect("a reference");
    assert_eq!((at.region.name.as_str(), at.region.byte_size, at.offset, at.byte_size), ("gin", 256, 32, 16));
    let out = request.cuda.output("y").expect("a reference");
    assert_eq!((out.region.name.as_str(), out.offset, out.byte_size), ("gout", 128, 64));
    assert!(request.cuda.output("z").is_none(), "system regions are written here");
    assert_eq!(outputs.find("y").map(|r| r.offset), Some(128), "the answer still says where it went");

    // The runner answers the CUDA output without bytes; only the system one is written here.
    let mut response = InferResponse {
        model_name: "m".into(),
        model_version: "1".into(),
        id: String::new(),
        outputs: vec![output("y", Vec::new()), output("z", vec![5; 8])],
    };
    outputs.write(&mut response).await.expect("written");
    assert_eq!(object.bytes(0, 8), [5; 8]);

    // Unregistered while the request still holds it: the runner is told once the request ends.
    let runner = Arc::new(Notices::default());
    let closer: Arc<dyn CudaCloser> = runner.clone();
    let lease = request.cuda.input("x").and_then(|r| r.lease.clone()).expect("held");
    lease.sent_to(&closer);
    let id = request.cuda.input("x").map(|r| r.region.id).expect("id");
    drop(lease);
    shm.unregister(None, Kind::Cuda, None).expect("unregister");
    assert!(runner.0.lock().is_empty(), "the request still names it");
    drop(request);
    // The registry's entry is dropped on the blocking pool (closing may wait on the device).
    for _ in 0..200 {
        if !runner.0.lock().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(*runner.0.lock(), [id]);

    // Windows are checked here, before anything is sent.
    fake_cuda(&shm, None, "gin", 256).expect("again");
    let mut request = InferRequest { inputs: vec![cuda_input("x", 16)], ..Default::default() };
    let inputs = vec![ShmInput { index: 0, at: ShmRef { region: "gin".into(), offset: 250, byte_size: 16 } }];
    let e = tensors::resolve(&shm, None, &mut request, inputs).await.expect_err("past the end");
    assert_eq!(e.message, "Invalid offset + byte size for shared memory region: 'gin'");
}

#[tokio::test]
async fn in_process_a_cuda_region_without_cuda_fails_the_request_cleanly() {
    if cuda_ipc::library().is_ok() {
        return;
    }
    let shm = serve();
    fake_cuda(&shm, None, "g", 64).expect("cuda");
    let mut request = InferRequest { inputs: vec![cuda_input("x", 16)], ..Default::default() };
    let inputs = vec![ShmInput { index: 0, at: ShmRef { region: "g".into(), offset: 0, byte_size: 16 } }];
    let e = tensors::resolve(&shm, None, &mut request, inputs).await.expect_err("no CUDA");
    assert_eq!(e.kind, ErrorKind::InvalidArg);
    assert_eq!(
        e.message,
        "failed to use CUDA shared memory region 'g': CUDA is not available in the process that runs the model \
         (libcuda.so.1 not found)"
    );
    assert!(request.cuda.is_empty(), "nothing to carry: this process copies");
}

#[tokio::test]
async fn inputs_read_from_regions_obey_the_request_size_limit() {
    // Checked before any region is looked up or read: no region needs to exist.
    let shm = SharedMemory::new(ShmPolicy::serve(true).with_max_input_bytes(1000));
    let at = |byte_size| ShmRef { region: "r".into(), offset: 0, byte_size };
    let mut request = InferRequest::default();
    let inputs = vec![ShmInput { index: 0, at: at(600) }, ShmInput { index: 1, at: at(600) }];
    let e = tensors::resolve(&shm, None, &mut request, inputs).await.expect_err("1200 bytes > 1000");
    assert_eq!(e.kind, ErrorKind::InvalidArg);
    assert!(e.message.contains("1200 bytes") && e.message.contains("1000 bytes"), "{}", e.message);
}
