/* Reading a .pi2 model file (layout: docs/FORMAT.md). pi2_file_open maps the file read-only and
 * validates the header, the section table, every tensor entry and the checksums before returning;
 * after that, tensor data pointers can be used without further bounds checks. */
#ifndef PI2_PI2FILE_H
#define PI2_PI2FILE_H

#include <stddef.h>
#include <stdint.h>

#define PI2_FORMAT_VERSION 1
#define PI2_HEADER_BYTES 4096
#define PI2_PAGE 4096
#define PI2_NAME_BYTES 64
#define PI2_TYPE_I32 26 /* index tensors (neuron order); not a weight type */

enum { PI2_ARCH_LLAMA = 1, PI2_ARCH_MOE = 2 };
enum { PI2_ACT_SWIGLU = 1, PI2_ACT_RELU = 2, PI2_ACT_DRELU = 3 };
enum { PI2_FLAG_TIED = 1u << 0, PI2_FLAG_DENSE_DOWN = 1u << 1, PI2_FLAG_PREDICTOR = 1u << 2,
       PI2_FLAG_GATE_PREDICTOR = 1u << 3 /* the predictor is the thresholded gate (CATS), with bit2, SwiGLU */ };
enum { PI2_SEC_NEURONS = 0, PI2_SEC_RESIDENT, PI2_SEC_TABLE, PI2_SEC_TOKENIZER, PI2_SEC_METADATA,
       PI2_N_SECTIONS };

typedef struct {
    uint64_t offset, size;
    uint32_t crc32;
} pi2_section;

typedef struct {
    uint32_t version, arch, ffn_act;
    uint32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_expert, n_expert_used;
    uint32_t n_ctx_train;
    float rope_theta, rms_eps;
    uint32_t rope_type, flags, neuron_type, bundle_align;
    uint64_t part_bytes, bundle_stride, ffn_block_bytes;
    uint32_t n_tensors;
    uint64_t file_bytes;
    pi2_section sections[PI2_N_SECTIONS];
} pi2_header;

typedef struct {
    char name[PI2_NAME_BYTES];
    int type, n_dims;
    int64_t ne[4];
    int region;
    uint64_t offset, nbytes;
    const uint8_t *data; /* into the mapping */
} pi2_tensor;

typedef struct {
    char path[512];
    const uint8_t *map;
    size_t size;
    pi2_header h;
    pi2_tensor *tensors;
    uint32_t *name_index, name_mask; /* hash of tensor names: slot -> index + 1, 0 = empty */
    const char *metadata; /* JSON, not NUL-terminated */
    size_t metadata_len;
    const uint8_t *tokenizer;
    size_t tokenizer_len;
} pi2_file;

/* 0 on success; -1 with pi2_last_error() = "PATH: problem". verify_neurons: also check the neuron
 * region's CRC (reads the whole region). */
int pi2_file_open(pi2_file *f, const char *path, int verify_neurons);
void pi2_file_close(pi2_file *f);

/* The tensor with this name, or NULL. */
const pi2_tensor *pi2_file_find(const pi2_file *f, const char *name);

/* 1 when the tensor's data holds at least `bytes` (its validated extent inside the file): what
 * binding code checks before it reads `bytes` from t->data, so a shape check that misses a
 * dimension cannot turn into a read past the mapping. */
static inline int pi2_tensor_holds(const pi2_tensor *t, uint64_t bytes) { return bytes <= t->nbytes; }

/* Verify one section's checksum: 0 ok, -1 with an error naming the section. */
int pi2_file_verify_section(const pi2_file *f, int section);

const char *pi2_arch_name(uint32_t arch);
const char *pi2_act_name(uint32_t act);
const char *pi2_section_name(int section);

#endif
