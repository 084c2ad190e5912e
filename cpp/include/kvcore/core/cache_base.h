// The faces of a cache, reachable from CacheBase without RTTI: the runner
// drives the sequence (SequenceControl), the backend asks where bytes go
// (SequencePlanner). Faces of higher layers (the batch faces) are looked up by
// a FaceId and typed by that layer: this header names no higher layer.
#pragma once

#include "kvcore/core/config.h"
#include "kvcore/core/geometry.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"
#include "kvcore/core/step.h"

namespace kvcore {

/// Runner face: one logical length for the whole model.
class SequenceControl {
 public:
  /// Committed length L: positions [0, L) hold K/V.
  virtual int length() const noexcept = 0;
  virtual int capacity() const noexcept = 0;
  virtual int max_step() const noexcept = 0;
  /// n >= 0 and length() + n <= capacity().
  virtual bool can_extend(int n) const noexcept = 0;
  /// Begins a step of T tokens at position length(); replaces an uncommitted step.
  /// InvalidArgument: T outside [1, max_step]. OutOfResources: length + T > capacity.
  virtual Result<Step> begin_step(int T) noexcept = 0;
  /// Ok when `step` is the begun, uncommitted step; InvalidState otherwise.
  virtual Status check_step(const Step& step) const noexcept = 0;
  /// length = step.end(). InvalidState unless `step` is the begun step.
  virtual Status commit(const Step& step) noexcept = 0;
  /// Ends `step`, the begun step, without committing it: the length stays, no
  /// step is begun. Its rows still count as written for can_rewind (the backend
  /// may have written them). InvalidState (nothing changes) unless `step` is the
  /// begun step.
  virtual Status abort(const Step& step) noexcept = 0;
  /// length = n; ends a begun step. InvalidArgument: n outside [0, length].
  /// InvalidState: some layer no longer holds history a query at n needs.
  virtual Status rewind(int n) noexcept = 0;
  /// True exactly when rewind(n) would succeed. Never fails.
  virtual bool can_rewind(int n) const noexcept = 0;
  /// length = 0; ends a begun step. Always succeeds.
  virtual void clear() noexcept = 0;

 protected:
  ~SequenceControl() = default;
};

/// Backend face: each layer's geometry and shape, and integer plans per layer.
class SequencePlanner {
 public:
  virtual int n_layers() const noexcept = 0;
  /// Rows a byte layer allocates per layer before growing lazily
  /// (CacheConfig::initial_capacity).
  virtual int initial_capacity() const noexcept = 0;
  /// Physical rows of `layer`'s pool (geometry(layer).rows).
  /// InvalidArgument: layer outside [0, n_layers).
  virtual Result<int> rows(int layer) const noexcept = 0;
  /// How `layer`'s positions map onto its rows: what a byte layer sizes and
  /// addresses storage by. InvalidArgument: layer outside [0, n_layers).
  virtual Result<LayerGeometry> geometry(int layer) const noexcept = 0;
  /// `layer`'s policy and row shape (heads, dims), broadcast resolved.
  /// InvalidArgument: layer outside [0, n_layers).
  virtual Result<LayerConfig> layer_config(int layer) const noexcept = 0;
  /// The plan of `layer` for the begun step, which must start at `position` with
  /// T tokens. InvalidArgument: bad layer. InvalidState: no such begun step.
  virtual Result<SeqStepPlan> plan(int layer, int position, int T) const noexcept = 0;
  /// The plan of `layer` for `step`, which must be the begun step (same id).
  /// InvalidArgument: bad layer. InvalidState: `step` is not the begun step.
  virtual Result<SeqStepPlan> plan(int layer, const Step& step) const noexcept = 0;
  /// The plan `layer` would get from the next step of T tokens, beginning
  /// nothing: begin_step(T) then gives this very plan. InvalidArgument: bad
  /// layer, T outside [1, max_step]. OutOfResources: length + T > capacity.
  virtual Result<SeqStepPlan> preview(int layer, int T) const noexcept = 0;
  /// May a query at q see key k on `layer`? InvalidArgument: bad layer, q or k < 0.
  virtual Result<bool> visible(int layer, int q, int k) const noexcept = 0;

 protected:
  ~SequencePlanner() = default;
};

/// The faces a cache may show, by id. The core knows each face only by this
/// number: a face's type is declared in its own layer, which specializes
/// FaceType for its ids (the batch faces: kvcore/batch/batch_faces.h), so this
/// layer names no higher one.
enum class FaceId : int {
  sequence_control = 0,  ///< SequenceControl (this header)
  sequence_planner = 1,  ///< SequencePlanner (this header)
  batch_control = 2,     ///< BatchControl (kvcore/batch/batch_faces.h)
  batch_planner = 3,     ///< BatchPlanner (kvcore/batch/batch_faces.h)
};

/// The type of face `Id`: `type` is declared by a specialization beside the
/// face's declaration. A lookup of a face whose header is not included does
/// not compile.
template <FaceId Id>
struct FaceType;
/// What a FaceType specialization derives from: `type` is T.
template <class T>
struct FaceTypeIs {
  using type = T;
};
template <>
struct FaceType<FaceId::sequence_control> : FaceTypeIs<SequenceControl> {};
template <>
struct FaceType<FaceId::sequence_planner> : FaceTypeIs<SequencePlanner> {};

/// What registries hold. A cache answers face(id) with a pointer to itself as
/// that face (a static upcast, no dynamic_cast), or nullptr when it has no such
/// face; the typed accessors below cast that answer back.
class CacheBase {
 public:
  virtual ~CacheBase() = default;
  /// This cache as face `id` (a pointer to FaceType<id>::type, as void*), or
  /// nullptr: the default has no face.
  virtual void* face(FaceId id) noexcept {
    (void)id;
    return nullptr;
  }
  /// Face `Id`, typed; nullptr when the cache has none.
  template <FaceId Id>
  typename FaceType<Id>::type* as_face() noexcept {
    return static_cast<typename FaceType<Id>::type*>(face(Id));
  }
  /// Runner face of a one-sequence cache (SequenceCache).
  SequenceControl* as_control() noexcept { return as_face<FaceId::sequence_control>(); }
  /// Backend face of a one-sequence cache.
  SequencePlanner* as_planner() noexcept { return as_face<FaceId::sequence_planner>(); }
  /// Runner face of a many-sequence cache (BatchCache): BatchControl, declared
  /// in kvcore/batch/batch_faces.h, which a caller of this accessor includes.
  template <FaceId Id = FaceId::batch_control>
  typename FaceType<Id>::type* as_batch_control() noexcept {
    return as_face<Id>();
  }
  /// Backend face of a many-sequence cache: BatchPlanner (batch_faces.h).
  template <FaceId Id = FaceId::batch_planner>
  typename FaceType<Id>::type* as_batch_planner() noexcept {
    return as_face<Id>();
  }
};

}  // namespace kvcore
