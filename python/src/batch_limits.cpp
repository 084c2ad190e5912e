// BatchLimits: the limits a BatchCache sizes every table from.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings.h"
#include "config_repr.h"
#include "errors.h"
#include "kvcore/core/config.h"

namespace kvcore_py {

void register_batch_limits(py::module_& m) {
  py::class_<kvcore::BatchLimits> batch_limits(
      m, "BatchLimits",
      "Limits of a many-sequence cache (BatchCache), fixed at its creation: every table it "
      "keeps is sized from them, so no step allocates. A SequenceCache ignores them.");
  copyable_value(batch_limits);
  batch_limits
      .def(py::init([](const PyInt& block_size, const PyInt& max_seqs, const PyInt& max_step_tokens,
                       const PyInt& num_blocks, const PyInt& max_holes, const PyInt& max_active_seqs,
                       const PyInt& state_snapshots, const PyInt& page_layers, const PyInt& max_rewind,
                       const py::object& states_in_pool, const PyInt& table_page_blocks, const PyInt& table_pages,
                       const PyInt& state_block_size) {
             if (!py::isinstance<py::bool_>(states_in_pool))
               raise(kvcore::Error::InvalidArgument,
                     "states_in_pool = " + py::repr(states_in_pool).cast<std::string>() + ": must be a bool");
             kvcore::BatchLimits b;
             b.block_size = to_int("block_size", block_size);
             b.max_seqs = to_int("max_seqs", max_seqs);
             b.max_step_tokens = to_int("max_step_tokens", max_step_tokens);
             b.num_blocks = to_int("num_blocks", num_blocks);
             b.max_holes = to_int("max_holes", max_holes);
             b.max_active_seqs = to_int("max_active_seqs", max_active_seqs);
             b.state_snapshots = to_int("state_snapshots", state_snapshots);
             b.page_layers = to_int("page_layers", page_layers);
             b.max_rewind = to_int("max_rewind", max_rewind);
             b.states_in_pool = states_in_pool.cast<bool>();
             b.table_page_blocks = to_int("table_page_blocks", table_page_blocks);
             b.table_pages = to_int("table_pages", table_pages);
             b.state_block_size = to_int("state_block_size", state_block_size);
             return b;
           }),
           py::kw_only(), py::arg("block_size") = 16, py::arg("max_seqs") = 64,
           py::arg("max_step_tokens") = 0, py::arg("num_blocks") = 0, py::arg("max_holes") = 8, py::arg("max_active_seqs") = 0,
           py::arg("state_snapshots") = 0, py::arg("page_layers") = 0, py::arg("max_rewind") = -1,
           py::arg("states_in_pool") = false, py::arg("table_page_blocks") = 0, py::arg("table_pages") = 0,
           py::arg("state_block_size") = 0,
           "block_size: rows per block (1 = cell-granular). max_seqs: sequence ids are "
           "0..max_seqs-1. max_step_tokens: new tokens of one step over all its sequences (0: "
           "max_seqs * max_step, at most 2**20). num_blocks: blocks of the one pool every group draws from "
           "(0: what each group would need alone for max_active_seqs sequences, summed: a full table row per "
           "flat group, a window's blocks per ring). max_holes: removed middle "
           "ranges one sequence keeps apart. max_active_seqs: sequences active at once (0: max_seqs); "
           "each group's block tables hold one row of ceil(capacity / block_size) entries per active "
           "sequence. state_snapshots: named state "
           "snapshots each State group keeps for prefix reuse (a step ending on a full block names the state "
           "after it; 0: a model with State layers never hits a prefix), one state slot each. page_layers: layers "
           "of one policy form groups of at most this many, so that the pool's pages (one layer of each group) "
           "leave no storage unused (0: the fewest layers any policy has, vLLM's rule). max_rewind: the longest "
           "rewind, in positions, that ring and chunked groups keep history for (each position costs every "
           "sequence a ring position; -1: max_step, 0: never rewinds, as vLLM's sliding window; in "
           "[-1, capacity]). states_in_pool: the State groups take their state slots from the one pool, one "
           "block per state, and State layers form groups of at most page_layers as K/V layers do (vLLM's "
           "hybrid allocator; docs/batch.md section 10): a named snapshot is then a cached block, kept until the "
           "pool needs it, and state_snapshots > 0 only turns naming on; False: each State group owns slots of "
           "its own beside the pool (InvalidArgumentError: not a bool). table_page_blocks: 0 keeps each group's "
           "block table row a dense array of ceil(capacity / block_size) entries per active sequence; P (a power "
           "of two in [1, 2**20]) pages the rows: a row is a directory of pages of P entries taken when it first "
           "names a block in a page's span and given back once the page names none, so the tables cost what the "
           "sequences hold (docs/batch.md section 5, 'Tables sized by use'); a plan's entry_tables reads either "
           "layout. table_pages: with paged tables, the pages every group draws from (0: every active row full in "
           "every group); a step, fork, adopt_prefix or admit short of pages raises CapacityError and changes "
           "nothing. state_block_size: the State groups' block, in tokens: a committed step names the state at "
           "its end only at a multiple of it, so hits on State layers land there (vLLM's mamba align mode at its "
           "block size; fewer snapshots, coarser hits): 0 or block_size, or a larger multiple of block_size up to "
           "capacity; an imported record still names its one state at its length when that ends a full block. "
           "Checked when a BatchCache is built (InvalidArgumentError naming the field).")
      .def_readonly("block_size", &kvcore::BatchLimits::block_size, "Rows per block.")
      .def_readonly("max_seqs", &kvcore::BatchLimits::max_seqs, "Sequence ids are 0..max_seqs-1.")
      .def_readonly("max_step_tokens", &kvcore::BatchLimits::max_step_tokens,
                    "New tokens of one step over all sequences (0: the default).")
      .def_readonly("num_blocks", &kvcore::BatchLimits::num_blocks,
                    "Blocks of the one pool every group draws from (0: the default).")
      .def_readonly("max_holes", &kvcore::BatchLimits::max_holes,
                    "Removed middle ranges one sequence keeps apart.")
      .def_readonly("max_active_seqs", &kvcore::BatchLimits::max_active_seqs,
                    "Sequences active at once: block table rows per group (0: max_seqs).")
      .def_readonly("state_snapshots", &kvcore::BatchLimits::state_snapshots,
                    "Named state snapshots per State group for prefix reuse (0: none).")
      .def_readonly("page_layers", &kvcore::BatchLimits::page_layers,
                    "Most layers of one group (0: the fewest layers any policy has).")
      .def_readonly("max_rewind", &kvcore::BatchLimits::max_rewind,
                    "Longest rewind, in positions, ring and chunked groups keep history for (-1: max_step).")
      .def_readonly("states_in_pool", &kvcore::BatchLimits::states_in_pool,
                    "Do the State groups take their state slots from the one pool (one block per state)?")
      .def_readonly("table_page_blocks", &kvcore::BatchLimits::table_page_blocks,
                    "Block table entries per table page (0: unpaged, a dense row per active sequence).")
      .def_readonly("table_pages", &kvcore::BatchLimits::table_pages,
                    "Table pages every group draws from when paged (0: every active row full).")
      .def_readonly("state_block_size", &kvcore::BatchLimits::state_block_size,
                    "The State groups' block in tokens: states are named only at its multiples (0: block_size).")
      .def("__repr__", [](const kvcore::BatchLimits& b) { return repr(b); });
}

}  // namespace kvcore_py
