/* DLPack ABI, written from the DLPack specification (v1.1 structs, the legacy v0 struct beside them, and the
 * v1.2 C exchange table). Debian ships a 0.6 header without the versioned struct, so the project defines its own. */
#ifndef FLASHSCI_DLPACK_H
#define FLASHSCI_DLPACK_H

#include <stdint.h>

#define FS_DLPACK_MAJOR 1
#define FS_DLPACK_MINOR 0

enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 };
enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLComplex = 5, kDLBool = 6 };

#define DLPACK_FLAG_BITMASK_READ_ONLY (1UL << 0UL)
#define DLPACK_FLAG_BITMASK_IS_COPIED (1UL << 1UL)

typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct { uint32_t major; uint32_t minor; } DLPackVersion;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

/* legacy capsule "dltensor" */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/* versioned capsule "dltensor_versioned" (DLPack >= 1.0) */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* The C exchange table (DLPack >= 1.2) a producer type publishes as the PyCapsule "dlpack_exchange_api" in its
 * __dlpack_c_exchange_api__ attribute: tensors read and made without Python calls. Every function returns 0, or -1
 * with a Python exception set (the allocator reports through set_error instead). */
#define FS_DLPACK_EXCHANGE_MINOR 2
typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api;
} DLPackExchangeAPIHeader;

typedef struct {
    DLPackExchangeAPIHeader header;
    int (*managed_tensor_allocator)(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                                    void (*set_error)(void *error_ctx, const char *kind, const char *message));
    int (*managed_tensor_from_py_object_no_sync)(void *py_object, DLManagedTensorVersioned **out);
    int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor, void **out_py_object);
    /* non-owning: shape, strides and data stay the producer's, valid while the object lives; may be NULL */
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} DLPackExchangeAPI;

#endif
