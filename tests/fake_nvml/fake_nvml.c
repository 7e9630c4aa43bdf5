/*
 * A fake libnvidia-ml.so.1 that Tessera's tests load through the real nvml-wrapper code path
 * (`tessera worker --nvml-library <this .so>`), so the NVML inventory, the Xid health watch and
 * the GPU metrics run in CI without a GPU.
 *
 * Build: gcc -shared -fPIC -O1 -o libnvidia-ml.so.1 fake_nvml.c
 * (the Rust tests do this themselves, once per test binary).
 *
 * It exports only the NVML functions Tessera calls; nvml-wrapper resolves every symbol when it
 * loads the library and reports a missing one only when it is called.
 *
 * Settings: each one is read from the environment variable, else from a line `NAME=value` of a
 * file `fake_nvml.conf` in the directory the library was loaded from (in-process tests copy the
 * library into a directory of their own with such a file: the environment is process-wide).
 *   FAKE_NVML_GPUS     the GPUs, `;`-separated: `<model>[:<profile>[*<count>],...]`, e.g.
 *                      `h200:1g.18gb*7;h100` (a GPU without a profile list is not in MIG mode).
 *                      Models: h200 (143771 MiB; 1g.18gb 1g.35gb 2g.35gb 3g.71gb 4g.71gb
 *                      7g.141gb) and h100 (81559 MiB; 1g.10gb 1g.20gb 2g.20gb 3g.40gb 4g.40gb
 *                      7g.80gb). Default: one h200 without MIG.
 *   FAKE_NVML_EVENTS   a file of events, one a line, each delivered once by nvmlEventSetWait
 *                      (the file is re-read from where the last complete line ended):
 *                        xid=<n> gpu=<index> gi=<id> ci=<id>   critical Xid (gi/ci default
 *                                                              4294967295: the whole GPU)
 *                        mig_config_change gpu=<index> mig=<profile list>
 *                                                              the GPU's MIG layout becomes the
 *                                                              list (as in FAKE_NVML_GPUS)
 *                        gpu_lost gpu=<index>                  the GPU falls off the bus: every
 *                                                              call on it and this wait answer
 *                                                              NVML_ERROR_GPU_IS_LOST
 *   FAKE_NVML_UTILIZATION       GPU utilization, percent (default 37)
 *   FAKE_NVML_MEMORY_USED_MIB   memory used on each GPU and MIG device, MiB (default 1024)
 *   FAKE_NVML_POWER_MW          power draw, milliwatts (default 312000)
 *   FAKE_NVML_POWER_LIMIT_MW    enforced power limit, milliwatts (default 700000)
 *   FAKE_NVML_ENERGY_MJ         energy since the driver loaded, millijoules (default 123456789;
 *                               grows by 1000 on every read)
 *
 * Layout: GPU i has uuid GPU-fa4e0000-0000-4000-8000-<i as 12 digits>; its MIG devices are
 * numbered in list order, GPU instance ids 1, 2, ... (new ids after a reconfiguration), compute
 * instance id 0, uuids MIG-fa4e<gpu:4x>-<gi:4x>-4000-8000-<gpu:6x><gi:6x>, names
 * "NVIDIA <model> MIG <profile>". GPU instance ids are not NVIDIA's placement ids; tests only
 * need them to be distinct and stable.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};
#define EVENT_XID 0x8ULL
#define EVENT_MIG_CONFIG_CHANGE 0x100ULL
#define WHOLE_GPU 0xFFFFFFFFu
#define MAX_GPUS 16
#define MAX_MIGS 7
#define MIB (1024ULL * 1024ULL)

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount,
        sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

struct device;
typedef struct device *nvmlDevice_t;
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct event_set {
    unsigned long long mask[MAX_GPUS];
};
typedef struct event_set *nvmlEventSet_t;

struct profile {
    const char *name;
    unsigned int slices;
    unsigned long long mib;
};
struct model {
    const char *key, *name;
    unsigned long long mib;
    struct profile profiles[7];
};
static const struct model MODELS[] = {
    {"h200", "H200", 143771,
     {{"1g.18gb", 1, 18432}, {"1g.35gb", 1, 35840}, {"2g.35gb", 2, 35840}, {"3g.71gb", 3, 72704},
      {"4g.71gb", 4, 72704}, {"7g.141gb", 7, 143360}}},
    {"h100", "H100 80GB HBM3", 81559,
     {{"1g.10gb", 1, 9984}, {"1g.20gb", 1, 19968}, {"2g.20gb", 2, 19968}, {"3g.40gb", 3, 40192},
      {"4g.40gb", 4, 40192}, {"7g.80gb", 7, 80384}}},
};

struct device {
    int is_mig;
    unsigned int index; /* GPU index; MIG: index of the parent */
    struct device *parent;
    const struct model *model;
    const struct profile *profile; /* MIG only */
    unsigned int gi, ci;
    char uuid[96], name[96];
};
struct gpu {
    struct device dev;
    int mig_mode, lost;
    unsigned int next_gi, mig_count;
    struct device migs[MAX_MIGS];
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static struct gpu gpus[MAX_GPUS];
static unsigned int gpu_count;
static long events_offset;
static unsigned long long energy_mj;
static char conf[8192];

/* Reads fake_nvml.conf beside this library, once per init. */
static void load_conf(void) {
    Dl_info info;
    conf[0] = '\0';
    if (!dladdr((void *)load_conf, &info) || !info.dli_fname) return;
    char path[4096];
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    if (slash) slash[1] = '\0'; else path[0] = '\0';
    strncat(path, "fake_nvml.conf", sizeof path - strlen(path) - 1);
    FILE *f = fopen(path, "r");
    if (!f) return;
    size_t n = fread(conf, 1, sizeof conf - 1, f);
    conf[n] = '\0';
    fclose(f);
}

/* A setting: the environment first, then the conf file; copied into `out`. */
static const char *setting(const char *name, char *out, size_t size) {
    const char *env = getenv(name);
    if (env) {
        snprintf(out, size, "%s", env);
        return out;
    }
    size_t len = strlen(name);
    for (const char *line = conf; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (strncmp(line, name, len) == 0 && line[len] == '=') {
            const char *value = line + len + 1;
            size_t n = strcspn(value, "\n");
            if (n >= size) n = size - 1;
            memcpy(out, value, n);
            out[n] = '\0';
            return out;
        }
    }
    return NULL;
}

static unsigned long long number(const char *name, unsigned long long fallback) {
    char buf[64];
    return setting(name, buf, sizeof buf) ? strtoull(buf, NULL, 10) : fallback;
}

static const struct profile *find_profile(const struct model *m, const char *name, size_t len) {
    for (int i = 0; i < 7 && m->profiles[i].name; i++)
        if (strlen(m->profiles[i].name) == len && strncmp(m->profiles[i].name, name, len) == 0)
            return &m->profiles[i];
    return NULL;
}

/* Replaces GPU `g`'s MIG devices with the list `spec` (`1g.18gb*3,2g.35gb`); -1 when invalid. */
static int set_migs(struct gpu *g, const char *spec, size_t len) {
    unsigned int count = 0;
    struct device migs[MAX_MIGS];
    const char *p = spec, *end = spec + len;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        const char *star = memchr(p, '*', (size_t)(item_end - p));
        const struct profile *prof = find_profile(g->dev.model, p, (size_t)((star ? star : item_end) - p));
        unsigned long times = star ? strtoul(star + 1, NULL, 10) : 1;
        if (!prof) return -1;
        for (unsigned long t = 0; t < times; t++) {
            if (count == MAX_MIGS) return -1;
            struct device *d = &migs[count++];
            memset(d, 0, sizeof *d);
            d->is_mig = 1;
            d->index = g->dev.index;
            d->parent = &g->dev;
            d->model = g->dev.model;
            d->profile = prof;
            d->gi = g->next_gi++;
            d->ci = 0;
            snprintf(d->uuid, sizeof d->uuid, "MIG-fa4e%04x-%04x-4000-8000-%06x%06x", d->index, d->gi, d->index, d->gi);
            snprintf(d->name, sizeof d->name, "NVIDIA %s MIG %s", d->model->name, prof->name);
        }
        p = comma ? comma + 1 : end;
    }
    memcpy(g->migs, migs, sizeof migs);
    g->mig_count = count;
    g->mig_mode = 1;
    return 0;
}

static int parse_gpus(const char *spec) {
    gpu_count = 0;
    const char *p = spec;
    while (*p) {
        const char *semi = strchr(p, ';');
        size_t len = semi ? (size_t)(semi - p) : strlen(p);
        const char *colon = memchr(p, ':', len);
        size_t key_len = colon ? (size_t)(colon - p) : len;
        const struct model *m = NULL;
        for (size_t i = 0; i < sizeof MODELS / sizeof MODELS[0]; i++)
            if (strlen(MODELS[i].key) == key_len && strncmp(MODELS[i].key, p, key_len) == 0) m = &MODELS[i];
        if (!m || gpu_count == MAX_GPUS) return -1;
        struct gpu *g = &gpus[gpu_count];
        memset(g, 0, sizeof *g);
        g->dev.index = gpu_count;
        g->dev.model = m;
        g->next_gi = 1;
        snprintf(g->dev.uuid, sizeof g->dev.uuid, "GPU-fa4e0000-0000-4000-8000-%012u", gpu_count);
        snprintf(g->dev.name, sizeof g->dev.name, "NVIDIA %s", m->name);
        if (colon && set_migs(g, colon + 1, len - key_len - 1) != 0) return -1;
        gpu_count++;
        p = semi ? semi + 1 : p + len;
    }
    return 0;
}

nvmlReturn_t nvmlInit_v2(void) {
    pthread_mutex_lock(&lock);
    load_conf();
    char spec[1024];
    int bad = parse_gpus(setting("FAKE_NVML_GPUS", spec, sizeof spec) ? spec : "h200");
    events_offset = 0;
    energy_mj = number("FAKE_NVML_ENERGY_MJ", 123456789);
    initialized = !bad;
    pthread_mutex_unlock(&lock);
    if (bad) fprintf(stderr, "fake_nvml: invalid FAKE_NVML_GPUS\n");
    return bad ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    return r == NVML_SUCCESS ? "Success" : "fake NVML error";
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    return copy_string(version, length, "580.95.05");
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *count = gpu_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (index >= gpu_count || !device) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index].dev;
    return NVML_SUCCESS;
}

/* What every device query answers first: uninitialized, bad handle, or a lost GPU. */
static nvmlReturn_t check(nvmlDevice_t d) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || d->index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpus[d->index].lost) return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}
#define CHECK(d) do { nvmlReturn_t r_ = check(d); if (r_ != NVML_SUCCESS) return r_; } while (0)

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    CHECK(d);
    return copy_string(uuid, length, d->uuid);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    CHECK(d);
    return copy_string(name, length, d->name);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    CHECK(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *index = d->index;
    return NVML_SUCCESS;
}

static unsigned long long total_mib(nvmlDevice_t d) {
    return d->is_mig ? d->profile->mib : d->model->mib;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    CHECK(d);
    unsigned long long total = total_mib(d) * MIB;
    unsigned long long used = number("FAKE_NVML_MEMORY_USED_MIB", 1024) * MIB;
    if (used > total) used = total;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    CHECK(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *current = *pending = (unsigned int)gpus[d->index].mig_mode;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    CHECK(d);
    *count = gpus[d->index].mig_mode && !d->is_mig ? MAX_MIGS : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    CHECK(d);
    struct gpu *g = &gpus[d->index];
    if (d->is_mig || !g->mig_mode) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= MAX_MIGS) return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= g->mig_count) return NVML_ERROR_NOT_FOUND;
    *mig = &g->migs[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    CHECK(d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *parent = d->parent;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    CHECK(d);
    *is_mig = (unsigned int)d->is_mig;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    CHECK(d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    CHECK(d);
    if (!d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    *id = d->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *a) {
    CHECK(d);
    if (!d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    memset(a, 0, sizeof *a);
    a->gpuInstanceSliceCount = a->computeInstanceSliceCount = d->profile->slices;
    a->multiprocessorCount = 16 * d->profile->slices;
    a->memorySizeMB = d->profile->mib;
    return NVML_SUCCESS;
}

/* Utilization and power are per GPU: MIG devices answer NOT_SUPPORTED, as NVML does. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    CHECK(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    u->gpu = (unsigned int)number("FAKE_NVML_UTILIZATION", 37);
    u->memory = u->gpu / 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *mw = (unsigned int)number("FAKE_NVML_POWER_MW", 312000);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) {
    CHECK(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    *mw = (unsigned int)number("FAKE_NVML_POWER_LIMIT_MW", 700000);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj) {
    CHECK(d);
    if (d->is_mig) return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&lock);
    energy_mj += 1000;
    *mj = energy_mj;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    CHECK(d);
    *types = EVENT_XID | (d->is_mig ? 0 : EVENT_MIG_CONFIG_CHANGE);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    CHECK(d);
    if (!set || d->is_mig) return NVML_ERROR_INVALID_ARGUMENT;
    if (types & ~(EVENT_XID | EVENT_MIG_CONFIG_CHANGE)) return NVML_ERROR_NOT_SUPPORTED;
    set->mask[d->index] |= types;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}

static unsigned int field(const char *line, const char *key, unsigned int fallback) {
    const char *p = strstr(line, key);
    return p ? (unsigned int)strtoul(p + strlen(key), NULL, 10) : fallback;
}

/* Takes the next complete line of the events file into `line`; 0 when there is none yet. */
static int next_event_line(char *line, size_t size) {
    char path[1024];
    if (!setting("FAKE_NVML_EVENTS", path, sizeof path)) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int got = 0;
    if (fseek(f, events_offset, SEEK_SET) == 0 && fgets(line, (int)size, f) && strchr(line, '\n')) {
        events_offset = ftell(f);
        got = 1;
    }
    fclose(f);
    return got;
}

/* Applies one event line; NVML_SUCCESS with `data` filled, GPU_IS_LOST, or NOT_FOUND to skip. */
static nvmlReturn_t apply_event(nvmlEventSet_t set, const char *line, nvmlEventData_t *data) {
    unsigned int gpu = field(line, "gpu=", 0);
    if (gpu >= gpu_count) return NVML_ERROR_NOT_FOUND;
    struct gpu *g = &gpus[gpu];
    memset(data, 0, sizeof *data);
    data->device = &g->dev;
    data->gpuInstanceId = data->computeInstanceId = WHOLE_GPU;
    if (strncmp(line, "gpu_lost", 8) == 0) {
        g->lost = 1;
        return NVML_ERROR_GPU_IS_LOST;
    }
    if (strncmp(line, "mig_config_change", 17) == 0) {
        const char *mig = strstr(line, "mig=");
        if (mig) set_migs(g, mig + 4, strcspn(mig + 4, " \n"));
        data->eventType = EVENT_MIG_CONFIG_CHANGE;
    } else if (strncmp(line, "xid=", 4) == 0) {
        data->eventType = EVENT_XID;
        data->eventData = field(line, "xid=", 0);
        data->gpuInstanceId = field(line, "gi=", WHOLE_GPU);
        data->computeInstanceId = field(line, "ci=", WHOLE_GPU);
    } else {
        return NVML_ERROR_NOT_FOUND;
    }
    return (set->mask[gpu] & data->eventType) ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec tick = {0, 10 * 1000 * 1000};
    for (unsigned int waited = 0;; waited += 10) {
        char line[512];
        pthread_mutex_lock(&lock);
        nvmlReturn_t r = NVML_ERROR_TIMEOUT;
        while (r == NVML_ERROR_TIMEOUT && next_event_line(line, sizeof line)) {
            r = apply_event(set, line, data);
            if (r == NVML_ERROR_NOT_FOUND) r = NVML_ERROR_TIMEOUT;
        }
        pthread_mutex_unlock(&lock);
        if (r != NVML_ERROR_TIMEOUT || waited >= timeout_ms) return r;
        nanosleep(&tick, NULL);
    }
}
