// kvcore-run: runs an exported program (.pte) whose attention is
// `kvcache::update_and_attend` in ExecuTorch's C++ runtime, with kvcore's kernel
// (kvcore_executorch_ops) behind the op. No Python in the process.
//
//   kvcore-run MODEL.pte --prompt TEXT [--tokenizer tokenizer.json] [--new 32] [--kv-dtype int8] [--lookup 3]
//              [--threads N] [--no-forward-last]
//   kvcore-run MODEL.pte --tokens 3,7,1,9 [--new 32] [--kv-dtype int8] [--lookup 3] [--threads N]
//
// It reads the cache's facts from the program's own metadata methods (kvcore_*,
// written by kvcore.integrations.executorch_runtime.export_program), configures
// kvcore's cache with them, prefills the prompt in max_step chunks, decodes
// greedily, and prints the generated text (with --prompt, streamed as it is decoded),
// the generated token ids and the speeds:
//
//    the cache keeps the window's last 512 positions   (the generated text: --prompt only)
//   tokens: 6 36 3 ...
//   prefill: 8 tokens in 0.41 ms (19512 tokens/s); decode: 32 tokens in 5.1 ms (6274 tokens/s)
//
// --prompt TEXT is encoded by the model's Hugging Face tokenizer.json (BPE with byte
// fallback, as Gemma 3's; bpe_tokenizer.h), with the special tokens its template adds
// (Gemma's <bos>): --tokenizer PATH, by default the tokenizer.json next to MODEL.pte.
// The generated ids are decoded by the same file, special tokens shown.
// --tokens takes the prompt as token ids instead, and prints ids only.
// The program takes (tokens [1, T] int64, positions [T, 1] int64) and returns
// logits [1, T, vocab] float32.
// A program whose metadata says kvcore_forward_last = 1 also has a method forward_last
// (the same inputs, the last position's logits only, [1, 1, vocab]): every prefill chunk
// goes through it (the vocabulary head on one row, not max_step rows); decoding and the
// --lookup verify forwards use forward. A program without kvcore_forward_last (exported
// before it) prefills through forward; --no-forward-last does so for any program.
// --lookup N: exact prompt-lookup speculative decoding: each forward verifies up to N
// tokens drafted from the history, and kvcore's rewind drops the rejected ones; the tokens
// are greedy decoding's, in fewer forwards when drafts are accepted.
// --threads N: kvcore's attention on N workers (kvcore_et_set_threads; 0, the default: one
// per processor online; 1: the runtime's thread alone), printed on the attention line.
// Exit status: 0, 1 on a runtime or kernel error (the message on stderr), 2 on bad usage.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr_maker.h>
#include <executorch/runtime/platform/runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bpe_tokenizer.h"

extern "C" {
int kvcore_et_configure(int n_layers, const int* kinds, const int* windows, const int* sinks, const int* sources,
                        int n_kv_heads, int head_dim, int v_head_dim, int n_q_heads, int capacity, int max_step,
                        int kv_dtype);
int kvcore_et_length(void);
int kvcore_et_rewind(int length);
long long kvcore_et_nbytes(void);
const char* kvcore_et_last_error(void);
int kvcore_et_set_threads(int threads);
int kvcore_et_threads(void);
}

namespace {

using ::executorch::extension::Module;
using ::executorch::runtime::EValue;

int usage() {
  std::fprintf(stderr,
               "usage: kvcore-run MODEL.pte (--prompt TEXT [--tokenizer tokenizer.json] | --tokens ID,ID,...) [--new N] "
               "[--kv-dtype float32|float16|bfloat16|int8|fp8] [--lookup N] [--threads N] [--no-forward-last]\n"
               "  --tokenizer: the model's Hugging Face tokenizer.json (default: tokenizer.json next to MODEL.pte)\n");
  return 2;
}

// The int values a constant method returns (one per output), or false with a message.
bool read_ints(Module& module, const char* name, std::vector<int>* out) {
  auto result = module.execute(name);
  if (!result.ok()) {
    std::fprintf(stderr, "kvcore-run: the program has no readable method %s (error 0x%x): export it with kvcore's "
                 "metadata (kvcore.integrations.executorch_runtime.export_program)\n",
                 name, static_cast<unsigned>(result.error()));
    return false;
  }
  out->clear();
  for (const EValue& value : *result) {
    if (!value.isInt()) {
      std::fprintf(stderr, "kvcore-run: method %s returns a value that is not an int\n", name);
      return false;
    }
    out->push_back(static_cast<int>(value.toInt()));
  }
  return true;
}

bool read_int(Module& module, const char* name, int* out) {
  std::vector<int> values;
  if (!read_ints(module, name, &values)) return false;
  if (values.size() != 1) {
    std::fprintf(stderr, "kvcore-run: method %s returns %zu values, expected 1\n", name, values.size());
    return false;
  }
  *out = values[0];
  return true;
}

// One forward of tokens[begin, end) at positions begin.. through `method` ("forward": a logits
// row per token; "forward_last": the last token's row only); the argmax of each logits row into
// `argmax`; false on an error (the message on stderr).
bool forward(Module& module, const char* method, const std::vector<std::int64_t>& tokens, std::size_t begin,
             std::size_t end, std::vector<std::int64_t>* argmax) {
  const int T = static_cast<int>(end - begin);
  std::vector<std::int64_t> ids(tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                                tokens.begin() + static_cast<std::ptrdiff_t>(end));
  std::vector<std::int64_t> positions(static_cast<std::size_t>(T));
  for (int i = 0; i < T; ++i) positions[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(begin) + i;
  auto ids_t = ::executorch::extension::from_blob(ids.data(), {1, T}, ::executorch::aten::ScalarType::Long);
  auto pos_t = ::executorch::extension::from_blob(positions.data(), {T, 1}, ::executorch::aten::ScalarType::Long);
  auto result = module.execute(method, {EValue(*ids_t), EValue(*pos_t)});
  if (!result.ok()) {
    const char* why = kvcore_et_last_error();
    std::fprintf(stderr, "kvcore-run: %s of positions %zu..%zu failed (ExecuTorch error 0x%x)%s%s\n", method, begin,
                 end - 1, static_cast<unsigned>(result.error()), why[0] ? ": " : "", why);
    return false;
  }
  const bool last_only = std::strcmp(method, "forward") != 0;
  const int rows = last_only ? 1 : T;
  const auto& logits = (*result)[0].toTensor();
  if (logits.dim() != 3 || logits.size(0) != 1 || logits.size(1) != rows) {
    std::fprintf(stderr, "kvcore-run: %s of %d tokens returned logits of %d dims (sizes %d, %d), expected [1, %d, vocab]\n",
                 method, T, static_cast<int>(logits.dim()), static_cast<int>(logits.size(0)),
                 logits.dim() > 1 ? static_cast<int>(logits.size(1)) : -1, rows);
    return false;
  }
  const int vocab = static_cast<int>(logits.size(2));
  argmax->clear();
  for (int t = 0; t < rows; ++t) {
    const float* row = logits.const_data_ptr<float>() + static_cast<std::ptrdiff_t>(t) * vocab;
    int best = 0;
    for (int v = 1; v < vocab; ++v) {
      if (row[v] > row[best]) best = v;
    }
    argmax->push_back(best);
  }
  return true;
}

// Prompt lookup: the tokens that followed the latest earlier occurrence of the history's last
// `ngram` tokens (3, 2, then 1), at most `n`; none when the history never repeated.
std::vector<std::int64_t> lookup(const std::vector<std::int64_t>& tokens, std::size_t n) {
  const std::size_t len = tokens.size();
  for (std::size_t ngram = 3; ngram >= 1; --ngram) {
    if (len <= ngram) continue;
    for (std::size_t start = len - ngram; start-- > 0;) {  // latest match first, never the suffix itself
      if (std::equal(tokens.end() - static_cast<std::ptrdiff_t>(ngram), tokens.end(),
                     tokens.begin() + static_cast<std::ptrdiff_t>(start))) {
        const std::size_t from = start + ngram;
        const std::size_t to = from + n < len ? from + n : len;
        return std::vector<std::int64_t>(tokens.begin() + static_cast<std::ptrdiff_t>(from),
                                         tokens.begin() + static_cast<std::ptrdiff_t>(to));
      }
    }
  }
  return {};
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Prints the text of the generated ids as they come: each call decodes them up to the last
// one that is not a byte token (a run of <0xNN> tokens decodes as one text, so it may still
// change; `last` decodes them all) and prints what was not printed yet.
class TextStream {
 public:
  explicit TextStream(const ::kvcore::et::BpeTokenizer* tokenizer) : tokenizer_(tokenizer) {}

  // False with the message on stderr when an id has no token.
  bool update(const std::vector<std::int64_t>& tokens, std::size_t begin, std::size_t end, bool last) {
    if (tokenizer_ == nullptr) return true;
    if (!last) {
      while (end > begin && tokenizer_->is_byte_token(static_cast<std::int32_t>(tokens[end - 1]))) --end;
    }
    ids_.clear();
    for (std::size_t i = begin; i < end; ++i) ids_.push_back(static_cast<std::int32_t>(tokens[i]));
    std::string error;
    if (!tokenizer_->decode(ids_.data(), ids_.size(), false, &text_, &error)) {
      std::fprintf(stderr, "\nkvcore-run: cannot decode the generated tokens: %s\n", error.c_str());
      return false;
    }
    if (text_.compare(0, printed_.size(), printed_) != 0) {  // the decoder rewrote what was printed
      if (last) std::printf("\n[the decoded text differs from the streamed one; in full:]\n%s\n", text_.c_str());
      return true;
    }
    std::fwrite(text_.data() + printed_.size(), 1, text_.size() - printed_.size(), stdout);
    printed_ = text_;
    if (last) std::printf("\n");
    std::fflush(stdout);
    return true;
  }

 private:
  const ::kvcore::et::BpeTokenizer* tokenizer_;
  std::vector<std::int32_t> ids_;
  std::string text_, printed_;
};

}  // namespace

int main(int argc, char** argv) {
  const char* path = nullptr;
  const char* prompt_text = nullptr;
  const char* tokenizer_path = nullptr;
  std::vector<std::int64_t> tokens;
  int n_new = 16;
  int kv_dtype_override = -1;  // -1: the program's kvcore_kv_dtype
  int lookup_n = 0;            // drafted tokens per forward (prompt lookup); 0: plain greedy
  int threads = 0;             // attention workers; 0: one per processor online
  bool use_forward_last = true;  // prefill through forward_last when the program has it
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tokens") == 0 && i + 1 < argc) {
      for (char* p = argv[++i]; *p != '\0';) {
        char* end = nullptr;
        const long long id = std::strtoll(p, &end, 10);
        if (end == p || id < 0) return usage();
        tokens.push_back(id);
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0') return usage();
      }
    } else if (std::strcmp(argv[i], "--prompt") == 0 && i + 1 < argc && prompt_text == nullptr) {
      prompt_text = argv[++i];
    } else if (std::strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc && tokenizer_path == nullptr) {
      tokenizer_path = argv[++i];
    } else if (std::strcmp(argv[i], "--kv-dtype") == 0 && i + 1 < argc) {
      const char* name = argv[++i];
      kv_dtype_override = std::strcmp(name, "float32") == 0    ? 0
                          : std::strcmp(name, "float16") == 0  ? 1
                          : std::strcmp(name, "bfloat16") == 0 ? 2
                          : std::strcmp(name, "int8") == 0     ? 5
                          : std::strcmp(name, "fp8") == 0      ? 6
                                                               : -2;
      if (kv_dtype_override == -2) return usage();
    } else if (std::strcmp(argv[i], "--lookup") == 0 && i + 1 < argc) {
      lookup_n = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--no-forward-last") == 0) {
      use_forward_last = false;
    } else if (std::strcmp(argv[i], "--new") == 0 && i + 1 < argc) {
      n_new = std::atoi(argv[++i]);
    } else if (argv[i][0] != '-' && path == nullptr) {
      path = argv[i];
    } else {
      return usage();
    }
  }
  if (path == nullptr || n_new < 0) return usage();
  if ((prompt_text != nullptr) == !tokens.empty()) {
    std::fprintf(stderr, "kvcore-run: give the prompt either as --prompt TEXT or as --tokens ID,..., one of them\n");
    return usage();
  }
  if (tokenizer_path != nullptr && prompt_text == nullptr) {
    std::fprintf(stderr, "kvcore-run: --tokenizer goes with --prompt (--tokens takes ids)\n");
    return usage();
  }
  ::kvcore::et::BpeTokenizer tokenizer;
  if (prompt_text != nullptr) {
    std::string default_path;
    if (tokenizer_path == nullptr) {  // tokenizer.json next to the program
      const char* slash = std::strrchr(path, '/');
      default_path = slash == nullptr ? std::string() : std::string(path, static_cast<std::size_t>(slash - path + 1));
      default_path += "tokenizer.json";
    }
    const char* from = tokenizer_path != nullptr ? tokenizer_path : default_path.c_str();
    std::string error;
    if (!tokenizer.load_file(from, &error)) {
      std::fprintf(stderr, "kvcore-run: the tokenizer is refused: %s%s\n", error.c_str(),
                   tokenizer_path == nullptr ? " (pass --tokenizer PATH, the model's Hugging Face tokenizer.json, or put "
                                               "it next to the .pte)" : "");
      return 1;
    }
    std::vector<std::int32_t> ids;
    if (!tokenizer.encode(prompt_text, true, &ids, &error)) {
      std::fprintf(stderr, "kvcore-run: --prompt is refused: %s\n", error.c_str());
      return 1;
    }
    if (ids.empty()) {
      std::fprintf(stderr, "kvcore-run: --prompt \"%s\" encodes to no tokens (and %s adds none): nothing to prefill\n",
                   prompt_text, from);
      return 1;
    }
    tokens.assign(ids.begin(), ids.end());
  }

  ::executorch::runtime::runtime_init();
  Module module(path);
  if (module.load() != ::executorch::runtime::Error::Ok) {
    std::fprintf(stderr, "kvcore-run: cannot load %s\n", path);
    return 1;
  }
  std::vector<int> kinds, windows, sinks, sources;
  int n_kv_heads = 0, head_dim = 0, v_head_dim = 0, n_heads = 0, capacity = 0, max_step = 0, kv_dtype = 0;
  if (!read_ints(module, "kvcore_kinds", &kinds) || !read_ints(module, "kvcore_windows", &windows) ||
      !read_ints(module, "kvcore_sinks", &sinks) || !read_ints(module, "kvcore_sources", &sources) ||
      !read_int(module, "kvcore_n_kv_heads", &n_kv_heads) || !read_int(module, "kvcore_head_dim", &head_dim) ||
      !read_int(module, "kvcore_v_head_dim", &v_head_dim) || !read_int(module, "kvcore_capacity", &capacity) ||
      !read_int(module, "kvcore_max_step", &max_step) || !read_int(module, "kvcore_n_heads", &n_heads) ||
      !read_int(module, "kvcore_kv_dtype", &kv_dtype)) {
    return 1;
  }
  // kvcore_forward_last: absent in programs exported before it (prefill through forward then).
  int has_forward_last = 0;
  const auto names = module.method_names();
  if (!names.ok()) {
    std::fprintf(stderr, "kvcore-run: cannot list the program's methods (error 0x%x)\n",
                 static_cast<unsigned>(names.error()));
    return 1;
  }
  if (names->count("kvcore_forward_last") != 0 && !read_int(module, "kvcore_forward_last", &has_forward_last)) return 1;
  if (has_forward_last != 0 && names->count("forward_last") == 0) {
    std::fprintf(stderr, "kvcore-run: the program's metadata says kvcore_forward_last = %d but it has no method "
                 "forward_last (a broken export; pass --no-forward-last to prefill through forward)\n", has_forward_last);
    if (use_forward_last) return 1;
  }
  const char* prefill_method = has_forward_last != 0 && use_forward_last ? "forward_last" : "forward";
  const std::size_t n = kinds.size();
  if (windows.size() != n || sinks.size() != n || sources.size() != n) {
    std::fprintf(stderr, "kvcore-run: the program's kvcore_* lists disagree in length (%zu kinds)\n", n);
    return 1;
  }
  if (kvcore_et_set_threads(threads) != 0) {
    std::fprintf(stderr, "kvcore-run: --threads %d is refused: %s\n", threads, kvcore_et_last_error());
    return 2;
  }
  if (kvcore_et_configure(static_cast<int>(n), kinds.data(), windows.data(), sinks.data(), sources.data(),
                          n_kv_heads, head_dim, v_head_dim, n_heads, capacity, max_step,
                          kv_dtype_override >= 0 ? kv_dtype_override : kv_dtype) != 0) {
    std::fprintf(stderr, "kvcore-run: the program's cache metadata is refused: %s\n", kvcore_et_last_error());
    return 1;
  }
  if (tokens.size() + static_cast<std::size_t>(n_new) > static_cast<std::size_t>(capacity)) {
    std::fprintf(stderr, "kvcore-run: %zu prompt tokens + %d new pass the program's capacity %d\n", tokens.size(),
                 n_new, capacity);
    return 1;
  }
  if (lookup_n < 0 || lookup_n + 1 > max_step) {
    std::fprintf(stderr, "kvcore-run: --lookup %d: a verify forward of 1 + N tokens must fit max_step = %d\n", lookup_n,
                 max_step);
    return 2;
  }
  const std::size_t prompt = tokens.size();
  const std::size_t step = static_cast<std::size_t>(max_step);
  std::vector<std::int64_t> argmax;
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t at = 0; at < prompt; at += step) {
    if (!forward(module, prefill_method, tokens, at, at + step < prompt ? at + step : prompt, &argmax)) return 1;
  }
  std::int64_t next = argmax.back();  // the next token, not fed yet
  const double prefill_ms = ms_since(t0);
  TextStream stream(prompt_text != nullptr ? &tokenizer : nullptr);
  t0 = std::chrono::steady_clock::now();
  int forwards = 0, drafted = 0, accepted = 0;
  // Greedy decoding; with --lookup N each forward also verifies up to N drafted tokens, and
  // the cache is rewound past the first one the model does not agree with (exact: the
  // tokens are greedy decoding's).
  for (int generated = 0; generated < n_new;) {
    if (!stream.update(tokens, prompt, tokens.size(), false)) return 1;  // the tokens generated so far
    const std::size_t fed_after = tokens.size();  // the cache holds this many positions
    tokens.push_back(next);
    ++generated;
    if (generated == n_new) break;  // the last token is not fed back
    std::vector<std::int64_t> drafts =
        lookup_n > 0 ? lookup(tokens, static_cast<std::size_t>(lookup_n)) : std::vector<std::int64_t>{};
    const std::size_t room = static_cast<std::size_t>(n_new - generated - 1);  // tokens the output still takes, fed
    if (drafts.size() > room) drafts.resize(room);
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    if (!forward(module, "forward", tokens, fed_after, tokens.size(), &argmax)) return 1;
    ++forwards;
    drafted += static_cast<int>(drafts.size());
    std::size_t m = 0;  // drafts the model agrees with
    while (m < drafts.size() && drafts[m] == argmax[m]) ++m;
    accepted += static_cast<int>(m);
    generated += static_cast<int>(m);
    next = argmax[m];
    if (m < drafts.size()) {
      tokens.resize(fed_after + 1 + m);
      if (kvcore_et_rewind(static_cast<int>(tokens.size())) != 0) {
        std::fprintf(stderr, "kvcore-run: rewind to %zu refused: %s\n", tokens.size(), kvcore_et_last_error());
        return 1;
      }
    }
  }
  const double decode_ms = ms_since(t0);
  if (!stream.update(tokens, prompt, tokens.size(), true)) return 1;
  std::printf("tokens:");
  for (std::size_t i = prompt; i < tokens.size(); ++i) std::printf(" %lld", static_cast<long long>(tokens[i]));
  std::printf("\n");
  const int decoded = n_new > 0 ? n_new - 1 : 0;
  std::printf("prefill: %zu tokens in %.2f ms (%.0f tokens/s); decode: %d tokens in %.2f ms (%.0f tokens/s)\n", prompt,
              prefill_ms, prefill_ms > 0 ? 1e3 * static_cast<double>(prompt) / prefill_ms : 0.0, decoded, decode_ms,
              decode_ms > 0 ? 1e3 * decoded / decode_ms : 0.0);
  std::printf("cache: %zu layers, length %d, %lld bytes of K/V\n", n, kvcore_et_length(), kvcore_et_nbytes());
  std::printf("attention: %d thread(s)\n", kvcore_et_threads());
  std::printf("prefill method: %s\n", prefill_method);
  if (lookup_n > 0) {
    std::printf("lookup: %d forwards for %d tokens, %d of %d drafted tokens accepted\n", forwards, decoded, accepted,
                drafted);
  }
  return 0;
}
