// PoolStorage: the storage both byte layers stand on (KVPool, PagedKVPool). A
// table of layers, each with one K and one V block, that either grows from a
// PoolAllocator (a heap table; blocks doubled on demand, new blocks first so a
// failed growth leaves the layer as it was) or lives in one caller arena (the
// table and every block carved from it, nothing allocated). It owns that
// storage, its growth, its arena carving and its byte accounting, and which
// layers hold K/V rows (a Shared layer reads its source's, a State layer holds
// state slots: row_layer, check_state_layer); the pools on top say what the
// rows mean. A layer may live in an earlier layer's storage (storage_of: a
// paged pool whose groups draw their blocks from one pool gives layers of
// different groups one storage): it has no blocks of its own, and follows
// its owner's growth.
//
// `Traits` describes a pool to its storage:
//   using Layer = ...;  // a LayerStorage with storage_rows(): the rows its
//                       // blocks hold at allocated_rows
//   static constexpr PoolNames kNames{...};  // the words its errors use
//   static Status bad_table(int n_layers) noexcept;  // a negative or
//                       // overflowing layer count (its own sentence: a
//                       // Status keeps only short text arguments whole)
//   static void grown(Layer&) noexcept;  // after a growth, before anything reads
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/pool_allocator.h"
#include "kvcore/pool/pool_bytes.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {

/// What every layer of a byte layer has: its row sizes, its rows and the
/// storage behind them (PoolLayer and PagedLayer add what their rows mean).
struct LayerStorage {
  /// The row shape: K rows n_kv_heads x head_dim values, V rows n_kv_heads x value_dim.
  int n_kv_heads = 0;
  int head_dim = 0;
  int value_dim = 0;
  /// Bytes of one K row: n_kv_heads * head_dim * element size (a quantized
  /// format's row with its scales: dtype.h's row_size).
  std::size_t k_row_bytes = 0;
  /// Bytes of one V row, as k_row_bytes with value_dim.
  std::size_t v_row_bytes = 0;
  /// The most rows the layer ever holds.
  int rows = 0;
  /// Rows backed by storage now (always `rows` in arena mode).
  int allocated_rows = 0;
  /// The layer's K and V storage: storage_rows() rows of k_row_bytes and
  /// v_row_bytes, row r at k + r * k_row_bytes. Moves when the layer grows.
  /// A block of no bytes (a KVPool State layer's V) may be null.
  unsigned char* k = nullptr;
  unsigned char* v = nullptr;
  /// The earlier layer whose K and V storage (and allocated_rows) this one
  /// shares, or -1: its own. Same row sizes and rows as that layer.
  int storage_of = -1;
};

/// The bytes of one state slot of each State layer, for the create, in_arena
/// and required_bytes of KVPool and PagedKVPool: bytes[l] for layer l, n
/// entries (one per layer; entries of other kinds are ignored). A state's
/// bytes are the caller's (its tensors, dtypes and shapes): a pool stores and
/// copies them whole.
struct StateSlotBytes {
  const std::size_t* bytes = nullptr;
  int n = 0;

  /// State layer l's slot size, checked: given (bytes set, l < n), at least
  /// 1 byte and below 2^31 (a record names it in an int32, docs/state.md).
  /// InvalidArgument naming the layer and the rule otherwise.
  Result<std::size_t> of(int l) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(bytes != nullptr && l < n, InvalidArgument,
                                 "layer %d is a State layer: its state slot size is missing (state_slot_bytes "
                                 "has %d entries, needs one per layer)",
                                 l, bytes == nullptr ? 0 : n);
    const std::size_t slot = bytes[l];
    KVCORE_CHECK_OR_RETURN_ERROR(slot >= 1, InvalidArgument,
                                 "layer %d is a State layer: state_slot_bytes[%d] = 0: a slot needs >= 1 byte", l,
                                 l);
    KVCORE_CHECK_OR_RETURN_ERROR(slot <= 0x7fffffffu, InvalidArgument,
                                 "layer %d is a State layer: state_slot_bytes[%d] = %zu: a slot holds at most "
                                 "2^31 - 1 bytes",
                                 l, l, slot);
    return slot;
  }
};

/// The words a pool's storage errors name it by.
struct PoolNames {
  /// The pool ("arena of N bytes: the <pool> needs M", "an arena <pool> cannot grow").
  const char* pool;
  /// Its table ("cannot allocate the <table> table of N layers").
  const char* table;
  /// Its arena ("layer l: the <arena> would overflow the address space").
  const char* arena;
  /// What grows ("cannot allocate N bytes to grow <growth>from A to B rows").
  const char* growth;
};

/// The storage of a byte layer: its layer table and every layer's K and V
/// blocks, grown from a PoolAllocator or carved from an arena.
/// A pool on it is movable (its storage moves along; the moved-from pool is
/// empty) and not copyable.
template <typename Traits>
class PoolStorage : protected PoolBytes {
 public:
  using Layer = typename Traits::Layer;

  PoolStorage(const PoolStorage&) = delete;
  PoolStorage& operator=(const PoolStorage&) = delete;
  PoolStorage& operator=(PoolStorage&&) = delete;

  /// The element type every row is stored in.
  DType dtype() const noexcept { return dtype_; }
  /// Layers: the planner's n_layers().
  int n_layers() const noexcept { return n_layers_; }
  /// True for a pool built by in_arena().
  bool uses_arena() const noexcept { return arena_; }

  /// Shape and storage of `layer`. InvalidArgument: layer outside [0, n_layers).
  Result<Layer> layer(int layer) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    return layers_[layer];
  }

  /// Bytes of the rows backed by storage now, K and V of every layer (the
  /// layer's storage_rows(): mirror rows included; a storage several layers
  /// share counted once).
  std::size_t reserved_bytes() const noexcept {
    std::size_t n = 0;
    for (int l = 0; l < n_layers_; ++l) {
      const Layer& layer = layers_[l];
      if (layer.storage_of >= 0) continue;
      n += (layer.k_row_bytes + layer.v_row_bytes) * static_cast<std::size_t>(layer.storage_rows());
    }
    return n;
  }

  /// Grows `layer` now to at least `rows` rows (writes below it then never
  /// allocate). InvalidArgument: bad layer, rows outside [0, rows(layer)].
  /// MemoryAllocationFailed: growth failed; the pool is unchanged.
  Status reserve(int layer, int rows) noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    const Layer& stored = layers_[layer];
    KVCORE_CHECK_OR_RETURN_ERROR(rows >= 0 && rows <= stored.rows, InvalidArgument,
                                 "reserve(layer %d, rows = %d): must be in [0, rows = %d]",
                                 layer, rows, stored.rows);
    return grow(layer, rows);
  }


  /// The layer whose K/V rows `what` (the calling verb, for the message)
  /// reads on `layer`: a Shared layer's source, else the layer itself.
  /// InvalidArgument: bad layer, a State layer (it holds state slots).
  Result<int> row_layer(int layer, const char* what) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    const LayerPolicy& policy = layers_[layer].policy;
    KVCORE_CHECK_OR_RETURN_ERROR(policy.kind != LayerPolicy::Kind::State, InvalidArgument,
                                 "%s of layer %d: a State layer holds state slots, not K/V rows (use "
                                 "write_state, read_state, state_slot)",
                                 what, layer);
    return policy.kind == LayerPolicy::Kind::Shared ? policy.source : layer;
  }

  /// Ok when `layer` is a State layer. InvalidArgument naming `what`:
  /// bad layer, another kind (it has no state slots).
  Status check_state_layer(int layer, const char* what) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_layer(layer));
    const LayerPolicy::Kind kind = layers_[layer].policy.kind;
    KVCORE_CHECK_OR_RETURN_ERROR(kind == LayerPolicy::Kind::State, InvalidArgument,
                                 "%s of layer %d: a %s layer has no state slots (the state verbs take "
                                 "State layers)",
                                 what, layer, to_string(kind));
    return Error::Ok;
  }

 protected:
  // Ok when the pool stores a quantized format and `out_type` is a compute
  // type: what every _values read checks first (`what` names the verb).
  Status check_dequantize(int layer, const char* what, DType out_type) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(is_quantized(dtype_), InvalidArgument,
                                 "%s of layer %d: the pool stores %s, not a quantized format (qint8, "
                                 "fp8_e4m3): read its rows as they are",
                                 what, layer, to_string(dtype_));
    return check_compute_type(layer, what, "values", out_type);
  }

  // `rows` consecutive rows of layer `layer` from k / v dequantized into
  // k_out / v_out as `out_type` values (the span reads of both pools:
  // held_values, rows_values). InvalidArgument: what check_dequantize
  // refuses, an output null or too small; nothing is written then.
  Status dequantize_span(int layer, const char* what, const unsigned char* k, const unsigned char* v,
                         int rows, DType out_type, void* k_out, std::size_t k_capacity, void* v_out,
                         std::size_t v_capacity) const noexcept {
    KVCORE_RETURN_IF_ERROR(check_dequantize(layer, what, out_type));
    const Layer& stored = layers_[layer];
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, what, "k_out", k_out, k_capacity, rows,
                                        value_row_bytes(stored.n_kv_heads, stored.head_dim, out_type), false));
    KVCORE_RETURN_IF_ERROR(check_buffer(layer, what, "v_out", v_out, v_capacity, rows,
                                        value_row_bytes(stored.n_kv_heads, stored.value_dim, out_type), false));
    dequantize_rows(dtype_, stored.n_kv_heads, stored.head_dim, k, rows, out_type, k_out);
    dequantize_rows(dtype_, stored.n_kv_heads, stored.value_dim, v, rows, out_type, v_out);
    return Error::Ok;
  }

  // A layer's K and V blocks.
  struct Blocks {
    unsigned char* k = nullptr;
    unsigned char* v = nullptr;
  };

  PoolStorage(DType dtype, PoolAllocator allocator) noexcept : dtype_(dtype), allocator_(allocator) {}
  PoolStorage(PoolStorage&& other) noexcept
      : dtype_(other.dtype_),
        allocator_(other.allocator_),
        layers_(other.layers_),
        n_layers_(other.n_layers_),
        arena_(other.arena_) {
    other.layers_ = nullptr;
    other.n_layers_ = 0;
  }
  ~PoolStorage() { release_layers(layers_, n_layers_, arena_, allocator_); }

  static Status check_allocator(const PoolAllocator& allocator) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(allocator.allocate != nullptr && allocator.release != nullptr,
                                 InvalidArgument,
                                 "allocator: both allocate and release must be set");
    return Error::Ok;
  }

  Status check_layer(int layer) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(layer >= 0 && layer < n_layers_, InvalidArgument,
                                 "layer = %d: must be in [0, n_layers = %d)", layer,
                                 n_layers_);
    return Error::Ok;
  }

  // Growing mode: a heap table of `n_layers` layers, layer l shaped by
  // shape_of(l, &layer) (a Status) and grown to min(initial_rows, its rows).
  // On a failure the destructor releases what was allocated so far.
  template <typename ShapeOf>
  Status build(int n_layers, int initial_rows, ShapeOf shape_of) noexcept {
    if (n_layers < 0) return Traits::bad_table(n_layers);
    void* table = std::calloc(static_cast<std::size_t>(n_layers > 0 ? n_layers : 1), sizeof(Layer));
    KVCORE_CHECK_OR_RETURN_ERROR(table != nullptr, MemoryAllocationFailed,
                                 "cannot allocate the %s table of %d layers", Traits::kNames.table,
                                 n_layers);
    layers_ = static_cast<Layer*>(table);
    n_layers_ = n_layers;
    for (int l = 0; l < n_layers; ++l) new (&layers_[l]) Layer();
    for (int l = 0; l < n_layers; ++l) {
      KVCORE_RETURN_IF_ERROR(shape_of(l, &layers_[l]));
      const int rows = layers_[l].rows;
      KVCORE_RETURN_IF_ERROR(grow(l, initial_rows < rows ? initial_rows : rows));
    }
    return Error::Ok;
  }

  // Arena bytes for `n_layers` layers shaped by shape_of (as build()): slack
  // to align the start, then the layer table and every K and V block (each
  // storage_rows() at full rows), each rounded to kArenaAlignment.
  template <typename ShapeOf>
  static Result<std::size_t> arena_bytes(int n_layers, ShapeOf shape_of) noexcept {
    std::uint64_t total = 0;
    const bool table_fits =
        n_layers >= 0 && checked_mul(static_cast<std::uint64_t>(n_layers), sizeof(Layer), &total) &&
        checked_add(round_up(total), kArenaAlignment - 1, &total);
    if (!table_fits) return Traits::bad_table(n_layers);
    for (int l = 0; l < n_layers; ++l) {
      Layer layer;
      KVCORE_RETURN_IF_ERROR(shape_of(l, &layer));
      layer.allocated_rows = layer.rows;
      if (layer.storage_of >= 0) continue;  // its owner's blocks
      const std::uint64_t rows = static_cast<std::uint64_t>(layer.storage_rows());
      const bool fits = checked_add(total, round_up(layer.k_row_bytes * rows), &total) &&
                        checked_add(total, round_up(layer.v_row_bytes * rows), &total);
      KVCORE_CHECK_OR_RETURN_ERROR(fits, InvalidArgument,
                                   "layer %d: the %s would overflow the address space", l,
                                   Traits::kNames.arena);
    }
    return static_cast<std::size_t>(total);
  }

  // Arena mode: checks `arena` (non-null, at least arena_bytes()) and carves
  // the table and every layer's zeroed K and V blocks, at full rows, from it.
  template <typename ShapeOf>
  Status carve(void* arena, std::size_t arena_bytes_given, int n_layers, ShapeOf shape_of) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(arena != nullptr, InvalidArgument, "arena: must not be null");
    KVCORE_ASSIGN_OR_RETURN(const std::size_t needed, arena_bytes(n_layers, shape_of));
    KVCORE_CHECK_OR_RETURN_ERROR(arena_bytes_given >= needed, InvalidArgument,
                                 "arena of %zu bytes: the %s needs %zu (required_bytes)",
                                 arena_bytes_given, Traits::kNames.pool, needed);
    arena_ = true;
    unsigned char* at = align_up(static_cast<unsigned char*>(arena));
    layers_ = reinterpret_cast<Layer*>(at);
    n_layers_ = n_layers;
    at += round_up(static_cast<std::uint64_t>(n_layers) * sizeof(Layer));
    for (int l = 0; l < n_layers; ++l) {
      Layer* layer = new (&layers_[l]) Layer();
      // Cannot fail: arena_bytes() already shaped every layer.
      KVCORE_RETURN_IF_ERROR(shape_of(l, layer));
      layer->allocated_rows = layer->rows;
      if (layer->storage_of >= 0) {  // its owner's blocks (an earlier layer: carved)
        layer->k = layers_[layer->storage_of].k;
        layer->v = layers_[layer->storage_of].v;
        continue;
      }
      const std::size_t storage = static_cast<std::size_t>(layer->storage_rows());
      const std::size_t k_bytes = layer->k_row_bytes * storage;
      const std::size_t v_bytes = layer->v_row_bytes * storage;
      layer->k = at;
      at += round_up(k_bytes);
      layer->v = at;
      at += round_up(v_bytes);
      if (k_bytes != 0) std::memset(layer->k, 0, k_bytes);
      if (v_bytes != 0) std::memset(layer->v, 0, v_bytes);
    }
    return Error::Ok;
  }

  // Grows `layer` to `rows`, keeping its data: new blocks first, then
  // copy, then release (or hand the old blocks to `replaced` when the caller
  // still reads them), so a failure leaves the layer as it was. A layer in
  // another's storage grows that storage (and every layer in it sees it).
  Status grow(int layer, int rows, Blocks* replaced = nullptr) noexcept {
    if (layers_[layer].storage_of >= 0) {
      const int owner = layers_[layer].storage_of;
      KVCORE_RETURN_IF_ERROR(grow(owner, rows, replaced));
      follow(owner);  // a fresh alias (build) takes its owner's blocks even when nothing grew
      return Error::Ok;
    }
    Layer& stored = layers_[layer];
    if (rows <= stored.allocated_rows) return Error::Ok;
    KVCORE_CHECK_OR_RETURN_ERROR(!arena_, Internal, "layer %d: an arena %s cannot grow to %d rows",
                                 layer, Traits::kNames.pool, rows);
    Layer grown = stored;
    grown.allocated_rows = rows;
    const std::size_t storage = static_cast<std::size_t>(grown.storage_rows());
    const std::size_t k_bytes = stored.k_row_bytes * storage;
    const std::size_t v_bytes = stored.v_row_bytes * storage;
    // A block of no bytes (a state layer's V) is not allocated: it stays null.
    auto* k = k_bytes == 0 ? nullptr : static_cast<unsigned char*>(allocator_.allocate(allocator_.context, k_bytes));
    auto* v = (k == nullptr && k_bytes != 0) || v_bytes == 0
                  ? nullptr
                  : static_cast<unsigned char*>(allocator_.allocate(allocator_.context, v_bytes));
    if ((k == nullptr && k_bytes != 0) || (v == nullptr && v_bytes != 0)) {
      if (k != nullptr) allocator_.release(allocator_.context, k);
      return Status::make(Error::MemoryAllocationFailed,
                          "layer %d: cannot allocate %zu bytes to grow %sfrom %d to %d rows",
                          layer, k_bytes + v_bytes, Traits::kNames.growth, stored.allocated_rows, rows);
    }
    const std::size_t k_old = stored.k_row_bytes * static_cast<std::size_t>(stored.allocated_rows);
    const std::size_t v_old = stored.v_row_bytes * static_cast<std::size_t>(stored.allocated_rows);
    if (k_old != 0) std::memcpy(k, stored.k, k_old);
    if (v_old != 0) std::memcpy(v, stored.v, v_old);
    if (k_bytes != k_old) std::memset(k + k_old, 0, k_bytes - k_old);
    if (v_bytes != v_old) std::memset(v + v_old, 0, v_bytes - v_old);
    const Blocks old{stored.k, stored.v};
    if (replaced != nullptr) {
      *replaced = old;
    } else {
      release(old);
    }
    stored.k = k;
    stored.v = v;
    stored.allocated_rows = rows;
    Traits::grown(stored);
    follow(layer);
    return Error::Ok;
  }

  // The layers in `owner`'s storage take its blocks and rows.
  void follow(int owner) noexcept {
    const Layer& from = layers_[owner];
    for (int l = owner + 1; l < n_layers_; ++l) {
      Layer& layer = layers_[l];
      if (layer.storage_of != owner) continue;
      layer.k = from.k;
      layer.v = from.v;
      layer.allocated_rows = from.allocated_rows;
    }
  }

  void release(const Blocks& blocks) noexcept {
    if (blocks.k != nullptr) allocator_.release(allocator_.context, blocks.k);
    if (blocks.v != nullptr) allocator_.release(allocator_.context, blocks.v);
  }

  DType dtype_;
  PoolAllocator allocator_;
  Layer* layers_ = nullptr;  // n_layers_ entries: heap (calloc) or arena
  int n_layers_ = 0;
  bool arena_ = false;
};

}  // namespace kvcore
