// BpeTokenizer: encodes text to token ids and decodes them back as a Hugging Face
// tokenizers `tokenizer.json` of the BPE kind says, for runners with no Python in the
// process (kvcore-run --prompt). Exception-free and RTTI-free; errors are returned as
// messages naming the field, the value and the rule.
//
// Supported (what Gemma 3's tokenizer.json uses, and a little around it); anything else
// is refused at load with a message naming the field and its value:
// - model: type "BPE", vocab (token -> id), merges (["a", "b"] pairs or "a b" strings),
//   byte_fallback (characters missing from the vocabulary become <0xNN> byte tokens),
//   unk_token / fuse_unk, ignore_merges; dropout null, no continuing_subword_prefix or
//   end_of_word_suffix.
// - added_tokens: matched in the raw text before anything else (leftmost, then longest),
//   special or not; normalized, lstrip, rstrip and single_word must be false.
// - normalizer: null, Replace (a String pattern), Prepend, or a Sequence of those.
// - pre_tokenizer: null, or Split on a String pattern (behaviour Removed, Isolated,
//   MergedWithPrevious or MergedWithNext; invert false).
// - post_processor: null, or TemplateProcessing (its `single` template: special tokens
//   around the sequence $A, such as Gemma's <bos>).
// - decoder: null, Replace (String pattern), ByteFallback, Fuse, Strip, or a Sequence of those.
// - truncation and padding null.
// Encoding follows tokenizers' order: added tokens split the text; each remaining piece
// is normalized, pre-tokenized into words, and each word is split into characters (or
// byte tokens) and merged by rank (the lowest-ranked adjacent pair first, leftmost on a
// tie); the post-processor's template wraps the ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "json_reader.h"

namespace kvcore {
namespace et {

class BpeTokenizer {
 public:
  /// The largest tokenizer.json read_file accepts, in bytes (Gemma 3's is about 33 MB).
  static constexpr std::size_t kMaxFileBytes = std::size_t{512} << 20;

  /// Loads the tokenizer.json at `path`. False with *error naming the path and the
  /// reason (unreadable, not JSON, an unsupported or malformed field). Replaces any
  /// tokenizer loaded before only on success.
  bool load_file(const char* path, std::string* error) {
    std::string text;
    if (!read_whole_file(path, kMaxFileBytes, &text, error)) return false;
    if (!load_json(text, error)) {
      *error = std::string(path) + ": " + *error;
      return false;
    }
    return true;
  }

  /// Loads a tokenizer from the text of a tokenizer.json. False with *error naming the
  /// field, its value and the rule (e.g. `model.type is "Unigram": only "BPE" is supported`).
  bool load_json(std::string_view json, std::string* error);

  /// Encodes UTF-8 `text` into *ids (replaced), with the post-processor's special tokens
  /// (such as <bos>) when `add_special_tokens`. False with *error when the text is not
  /// valid UTF-8 (naming the byte offset); *ids is then empty. An empty text gives just
  /// the template's special tokens.
  bool encode(std::string_view text, bool add_special_tokens, std::vector<std::int32_t>* ids,
              std::string* error) const;

  /// Decodes `n` ids into UTF-8 *text (replaced) through the decoder, leaving out special
  /// added tokens when `skip_special_tokens`. False with *error naming an id outside
  /// [0, vocab_size()) or with no token; *text is then empty. Byte tokens that do not form
  /// valid UTF-8 become U+FFFD, one per byte token (as tokenizers' ByteFallback does).
  bool decode(const std::int32_t* ids, std::size_t n, bool skip_special_tokens, std::string* text,
              std::string* error) const;

  /// One past the largest token id (vocabulary and added tokens); 0 before a load.
  std::int32_t vocab_size() const { return static_cast<std::int32_t>(id_to_token_.size()); }

  /// True when id `id` is a byte token `<0xNN>` of the vocabulary: the ByteFallback decoder
  /// joins a run of them into one text, so a decoded prefix ending in one may still change.
  /// False for anything else, an id out of range included.
  bool is_byte_token(std::int32_t id) const {
    if (id < 0 || id >= vocab_size()) return false;
    const std::string& t = id_to_token_[static_cast<std::size_t>(id)];
    return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
  }

  /// The id of token `token` (an added token first, then the vocabulary), or -1.
  std::int32_t token_id(std::string_view token) const {
    auto it = added_ids_.find(std::string(token));
    if (it != added_ids_.end()) return it->second;
    auto v = vocab_.find(std::string(token));
    return v == vocab_.end() ? -1 : v->second;
  }

 private:
  enum class NormKind { kReplace, kPrepend };
  struct NormStep {
    NormKind kind;
    std::string pattern, content;
  };
  enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext };
  enum class DecodeKind { kReplace, kByteFallback, kFuse, kStrip };
  struct DecodeStep {
    DecodeKind kind;
    std::string pattern, content;
    std::int64_t start = 0, stop = 0;  // Strip: characters taken from each end
  };
  struct Merge {
    std::uint32_t rank;
    std::int32_t id;
  };
  struct TrieNode {
    std::vector<std::pair<unsigned char, std::int32_t>> children;  // byte -> node
    std::int32_t token = -1;                                         // an added token ending here
  };

  bool load_model(JsonValue model, std::string* error);
  bool load_added(JsonValue added, std::string* error);
  bool load_normalizer(JsonValue v, const std::string& where, std::string* error);
  bool load_pre_tokenizer(JsonValue v, std::string* error);
  bool load_post_processor(JsonValue v, std::string* error);
  bool load_decoder(JsonValue v, const std::string& where, std::string* error);

  void normalize(std::string_view in, std::string* out) const;
  void pre_tokenize(std::string_view in, std::vector<std::string_view>* words) const;
  bool encode_word(std::string_view word, std::vector<std::int32_t>* ids, std::string* error) const;
  std::int32_t trie_longest(std::string_view text, std::size_t at, std::size_t* len) const;

  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> special_;  // per id: a special added token
  std::unordered_map<std::string, std::int32_t> added_ids_;
  std::vector<TrieNode> trie_;  // added tokens' contents; node 0 is the root
  std::int32_t byte_ids_[256];  // <0xNN> ids, -1 when absent
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  std::int32_t unk_id_ = -1;
  std::vector<NormStep> normalizer_;
  bool split_ = false;
  std::string split_pattern_;
  SplitBehavior split_behavior_ = SplitBehavior::kRemoved;
  std::vector<std::int32_t> prefix_ids_, suffix_ids_;  // the template's special ids around $A
  std::vector<DecodeStep> decoder_;
  bool has_decoder_ = false;  // without one, tokens are joined with spaces (as tokenizers does)
};

// --- loading ----------------------------------------------------------------------------

namespace bpe_detail {

// `"value"` for a message: a string quoted, anything else by its type.
inline std::string shown(JsonValue v) {
  if (!v.valid()) return "missing";
  if (v.is_string()) {
    std::string s(v.str().substr(0, 80));
    return "\"" + s + (v.str().size() > 80 ? "...\"" : "\"");
  }
  if (v.is_bool()) return v.boolean() ? "true" : "false";
  if (v.is_number()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v.number());
    return buf;
  }
  return json_type_name(v.type());
}

inline bool refuse(std::string* error, const std::string& field, JsonValue v, const char* rule) {
  *error = field + " is " + shown(v) + ": " + rule;
  return false;
}

// A `{"String": "..."}` pattern into *out; Regex patterns are refused.
inline bool string_pattern(JsonValue v, const std::string& field, std::string* out, std::string* error) {
  if (!v.is_object()) return refuse(error, field, v, "expected an object {\"String\": ...}");
  const JsonValue s = v.get("String");
  if (!s.is_string()) {
    if (v.get("Regex").valid()) {
      return refuse(error, field + ".Regex", v.get("Regex"), "regex patterns are not supported (only String)");
    }
    return refuse(error, field + ".String", s, "expected a string");
  }
  if (s.str().empty()) return refuse(error, field + ".String", s, "an empty pattern is not supported");
  *out = std::string(s.str());
  return true;
}

// A flag that must be false (or absent) for this reader.
inline bool must_be_false(JsonValue v, const std::string& field, std::string* error) {
  if (!v.valid() || (v.is_bool() && !v.boolean())) return true;
  return refuse(error, field, v, "only false is supported");
}

// The number of UTF-8 bytes of the character starting with byte `c` (valid text).
inline std::size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

}  // namespace bpe_detail

inline bool BpeTokenizer::load_json(std::string_view json, std::string* error) {
  using bpe_detail::refuse;
  JsonDocument doc;
  if (!doc.parse(json, error)) return false;
  const JsonValue root = doc.root();
  if (!root.is_object()) return refuse(error, "the top-level value", root, "expected an object");
  BpeTokenizer t;  // filled, then moved in: a failed load leaves *this as it was
  for (int b = 0; b < 256; ++b) t.byte_ids_[b] = -1;
  for (const char* field : {"truncation", "padding"}) {
    const JsonValue v = root.get(field);
    if (v.valid() && !v.is_null()) return refuse(error, field, v, "only null is supported");
  }
  if (!t.load_model(root.get("model"), error) || !t.load_added(root.get("added_tokens"), error) ||
      !t.load_normalizer(root.get("normalizer"), "normalizer", error) ||
      !t.load_pre_tokenizer(root.get("pre_tokenizer"), error) ||
      !t.load_post_processor(root.get("post_processor"), error) ||
      !t.load_decoder(root.get("decoder"), "decoder", error)) {
    return false;
  }
  *this = std::move(t);
  return true;
}

inline bool BpeTokenizer::load_model(JsonValue model, std::string* error) {
  using bpe_detail::refuse;
  if (!model.is_object()) return refuse(error, "model", model, "expected an object");
  const JsonValue type = model.get("type");
  if (type.valid() && !(type.is_string() && type.str() == "BPE")) {
    return refuse(error, "model.type", type, "only \"BPE\" is supported");
  }
  const JsonValue dropout = model.get("dropout");
  if (dropout.valid() && !dropout.is_null()) return refuse(error, "model.dropout", dropout, "only null is supported");
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const JsonValue v = model.get(field);
    if (v.valid() && !v.is_null() && !(v.is_string() && v.str().empty())) {
      return refuse(error, std::string("model.") + field, v, "only null is supported");
    }
  }
  for (const char* field : {"byte_fallback", "fuse_unk", "ignore_merges"}) {
    const JsonValue v = model.get(field);
    if (v.valid() && !v.is_bool()) return refuse(error, std::string("model.") + field, v, "expected true or false");
  }
  byte_fallback_ = model.get("byte_fallback").boolean();
  fuse_unk_ = model.get("fuse_unk").boolean();
  ignore_merges_ = model.get("ignore_merges").boolean();

  const JsonValue vocab = model.get("vocab");
  if (!vocab.is_object()) return refuse(error, "model.vocab", vocab, "expected an object of token -> id");
  if (vocab.size() > 0x7FFFFFF) return refuse(error, "model.vocab", vocab, "more than 2^27 tokens");
  vocab_.reserve(vocab.size());
  std::int64_t max_id = -1;
  for (JsonValue e = vocab.first(); e.valid(); e = e.next()) {
    std::int64_t id = 0;
    if (!e.as_int64(0, 0x7FFFFFFE, &id)) {
      return refuse(error, "model.vocab[\"" + std::string(e.key().substr(0, 80)) + "\"]", e,
                    "an id must be an integer in [0, 2^31 - 2]");
    }
    if (!vocab_.emplace(std::string(e.key()), static_cast<std::int32_t>(id)).second) {
      return refuse(error, "model.vocab[\"" + std::string(e.key().substr(0, 80)) + "\"]", e, "the token repeats");
    }
    if (id > max_id) max_id = id;
  }
  if (max_id >= static_cast<std::int64_t>(vocab.size()) * 4 + 1024) {
    *error = "model.vocab's largest id is " + std::to_string(max_id) + " for " + std::to_string(vocab.size()) +
             " tokens: ids must be dense (below 4 x the count + 1024)";
    return false;
  }
  id_to_token_.assign(static_cast<std::size_t>(max_id + 1), std::string());
  std::vector<bool> seen(id_to_token_.size(), false);
  for (const auto& kv : vocab_) {
    const auto i = static_cast<std::size_t>(kv.second);
    if (seen[i]) {
      *error = "model.vocab gives id " + std::to_string(kv.second) + " to two tokens (\"" + id_to_token_[i] +
               "\" and \"" + kv.first + "\")";
      return false;
    }
    seen[i] = true;
    id_to_token_[i] = kv.first;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const JsonValue unk = model.get("unk_token");
  if (unk.valid() && !unk.is_null()) {
    if (!unk.is_string()) return refuse(error, "model.unk_token", unk, "expected a string or null");
    auto it = vocab_.find(std::string(unk.str()));
    if (it == vocab_.end()) return refuse(error, "model.unk_token", unk, "the token is not in model.vocab");
    unk_id_ = it->second;
  }

  const JsonValue merges = model.get("merges");
  if (!merges.is_array()) return refuse(error, "model.merges", merges, "expected an array");
  merges_.reserve(merges.size());
  std::uint32_t rank = 0;
  for (JsonValue m = merges.first(); m.valid(); m = m.next(), ++rank) {
    const std::string field = "model.merges[" + std::to_string(rank) + "]";
    std::string a, b;
    if (m.is_array() && m.size() == 2 && m.first().is_string() && m.first().next().is_string()) {
      a = std::string(m.first().str());
      b = std::string(m.first().next().str());
    } else if (m.is_string()) {
      const std::string_view s = m.str();
      const std::size_t space = s.find(' ');
      if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos) {
        return refuse(error, field, m, "a string merge must be two tokens separated by one space");
      }
      a = std::string(s.substr(0, space));
      b = std::string(s.substr(space + 1));
    } else {
      return refuse(error, field, m, "expected a pair of strings [\"a\", \"b\"] or a string \"a b\"");
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), inew = vocab_.find(a + b);
    if (ia == vocab_.end()) return refuse(error, field + "[0]", m.is_array() ? m.first() : m, "not in model.vocab");
    if (ib == vocab_.end()) return refuse(error, field + "[1]", m.is_array() ? m.first().next() : m, "not in model.vocab");
    if (inew == vocab_.end()) return refuse(error, field, m, "the merged token is not in model.vocab");
    // As tokenizers builds its map: a pair listed again takes the later rank.
    merges_[pair_key(ia->second, ib->second)] = Merge{rank, inew->second};
  }
  return true;
}

inline bool BpeTokenizer::load_added(JsonValue added, std::string* error) {
  using bpe_detail::refuse;
  special_.assign(id_to_token_.size(), false);
  trie_.assign(1, TrieNode());
  if (!added.valid() || added.is_null()) return true;
  if (!added.is_array()) return refuse(error, "added_tokens", added, "expected an array");
  std::size_t i = 0;
  for (JsonValue t = added.first(); t.valid(); t = t.next(), ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!t.is_object()) return refuse(error, field, t, "expected an object");
    std::int64_t id = 0;
    if (!t.get("id").as_int64(0, 0x7FFFFFFE, &id)) {
      return refuse(error, field + ".id", t.get("id"), "an id must be an integer in [0, 2^31 - 2]");
    }
    const JsonValue content = t.get("content");
    if (!content.is_string() || content.str().empty()) {
      return refuse(error, field + ".content", content, "expected a non-empty string");
    }
    for (const char* flag : {"normalized", "lstrip", "rstrip", "single_word"}) {
      if (!bpe_detail::must_be_false(t.get(flag), field + "." + flag, error)) return false;
    }
    const JsonValue special = t.get("special");
    if (special.valid() && !special.is_bool()) return refuse(error, field + ".special", special, "expected true or false");
    if (static_cast<std::size_t>(id) >= id_to_token_.size()) {
      if (static_cast<std::size_t>(id) > id_to_token_.size() + (std::size_t{1} << 20)) {
        return refuse(error, field + ".id", t.get("id"), "far past the vocabulary's ids (more than 2^20 past)");
      }
      id_to_token_.resize(static_cast<std::size_t>(id) + 1);
      special_.resize(static_cast<std::size_t>(id) + 1, false);
    }
    const std::string text(content.str());
    auto it = vocab_.find(text);
    if (it != vocab_.end() && it->second != id) {
      return refuse(error, field + ".id", t.get("id"),
                    ("the vocabulary gives this token id " + std::to_string(it->second)).c_str());
    }
    if (!added_ids_.emplace(text, static_cast<std::int32_t>(id)).second) {
      return refuse(error, field + ".content", content, "the added token repeats");
    }
    id_to_token_[static_cast<std::size_t>(id)] = text;
    special_[static_cast<std::size_t>(id)] = special.boolean();
    std::int32_t node = 0;
    for (const char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      std::int32_t child = -1;
      for (const auto& e : trie_[static_cast<std::size_t>(node)].children) {
        if (e.first == c) child = e.second;
      }
      if (child < 0) {
        child = static_cast<std::int32_t>(trie_.size());
        trie_[static_cast<std::size_t>(node)].children.emplace_back(c, child);
        trie_.emplace_back();
      }
      node = child;
    }
    trie_[static_cast<std::size_t>(node)].token = static_cast<std::int32_t>(id);
  }
  return true;
}

inline bool BpeTokenizer::load_normalizer(JsonValue v, const std::string& where, std::string* error) {
  using bpe_detail::refuse;
  if (!v.valid() || v.is_null()) return true;
  if (!v.is_object()) return refuse(error, where, v, "expected an object or null");
  const JsonValue type = v.get("type");
  const std::string_view name = type.str();
  if (name == "Sequence") {
    const JsonValue list = v.get("normalizers");
    if (!list.is_array()) return refuse(error, where + ".normalizers", list, "expected an array");
    std::size_t i = 0;
    for (JsonValue n = list.first(); n.valid(); n = n.next(), ++i) {
      const std::string field = where + ".normalizers[" + std::to_string(i) + "]";
      if (n.get("type").str() == "Sequence") return refuse(error, field + ".type", n.get("type"), "nested Sequences are not supported");
      if (!load_normalizer(n, field, error)) return false;
    }
    return true;
  }
  if (name == "Replace") {
    NormStep step{NormKind::kReplace, "", ""};
    if (!bpe_detail::string_pattern(v.get("pattern"), where + ".pattern", &step.pattern, error)) return false;
    const JsonValue content = v.get("content");
    if (!content.is_string()) return refuse(error, where + ".content", content, "expected a string");
    step.content = std::string(content.str());
    normalizer_.push_back(std::move(step));
    return true;
  }
  if (name == "Prepend") {
    const JsonValue prepend = v.get("prepend");
    if (!prepend.is_string()) return refuse(error, where + ".prepend", prepend, "expected a string");
    normalizer_.push_back(NormStep{NormKind::kPrepend, "", std::string(prepend.str())});
    return true;
  }
  return refuse(error, where + ".type", type, "supported normalizers: Replace, Prepend, Sequence of those, or null");
}

inline bool BpeTokenizer::load_pre_tokenizer(JsonValue v, std::string* error) {
  using bpe_detail::refuse;
  if (!v.valid() || v.is_null()) return true;
  if (!v.is_object()) return refuse(error, "pre_tokenizer", v, "expected an object or null");
  const JsonValue type = v.get("type");
  if (type.str() != "Split") return refuse(error, "pre_tokenizer.type", type, "supported pre-tokenizers: Split, or null");
  if (!bpe_detail::string_pattern(v.get("pattern"), "pre_tokenizer.pattern", &split_pattern_, error)) return false;
  if (!bpe_detail::must_be_false(v.get("invert"), "pre_tokenizer.invert", error)) return false;
  const JsonValue behavior = v.get("behavior");
  const std::string_view b = behavior.str();
  if (b == "Removed") {
    split_behavior_ = SplitBehavior::kRemoved;
  } else if (b == "Isolated") {
    split_behavior_ = SplitBehavior::kIsolated;
  } else if (b == "MergedWithPrevious") {
    split_behavior_ = SplitBehavior::kMergedWithPrevious;
  } else if (b == "MergedWithNext") {
    split_behavior_ = SplitBehavior::kMergedWithNext;
  } else {
    return refuse(error, "pre_tokenizer.behavior", behavior,
                  "supported: Removed, Isolated, MergedWithPrevious, MergedWithNext");
  }
  split_ = true;
  return true;
}

inline bool BpeTokenizer::load_post_processor(JsonValue v, std::string* error) {
  using bpe_detail::refuse;
  if (!v.valid() || v.is_null()) return true;
  if (!v.is_object()) return refuse(error, "post_processor", v, "expected an object or null");
  const JsonValue type = v.get("type");
  if (type.str() != "TemplateProcessing") {
    return refuse(error, "post_processor.type", type, "supported post-processors: TemplateProcessing, or null");
  }
  const JsonValue single = v.get("single");
  if (!single.is_array()) return refuse(error, "post_processor.single", single, "expected an array");
  const JsonValue specials = v.get("special_tokens");
  bool seen_sequence = false;
  std::size_t i = 0;
  for (JsonValue item = single.first(); item.valid(); item = item.next(), ++i) {
    const std::string field = "post_processor.single[" + std::to_string(i) + "]";
    const JsonValue seq = item.get("Sequence");
    const JsonValue sp = item.get("SpecialToken");
    if (seq.is_object()) {
      if (seq.get("id").str() != "A") return refuse(error, field + ".Sequence.id", seq.get("id"), "a single template takes only \"A\"");
      if (seen_sequence) return refuse(error, field, item, "the sequence $A appears twice");
      seen_sequence = true;
    } else if (sp.is_object()) {
      const JsonValue name = sp.get("id");
      const JsonValue entry = specials.get(name.str());
      if (!name.is_string() || !entry.is_object()) {
        return refuse(error, field + ".SpecialToken.id", name, "not a key of post_processor.special_tokens");
      }
      const JsonValue ids = entry.get("ids");
      if (!ids.is_array()) return refuse(error, "post_processor.special_tokens." + std::string(name.str()) + ".ids", ids, "expected an array");
      for (JsonValue id = ids.first(); id.valid(); id = id.next()) {
        std::int64_t n = 0;
        if (!id.as_int64(0, static_cast<std::int64_t>(id_to_token_.size()) - 1, &n)) {
          return refuse(error, "post_processor.special_tokens." + std::string(name.str()) + ".ids", id,
                        "an id must be an integer in [0, vocabulary size)");
        }
        (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(static_cast<std::int32_t>(n));
      }
    } else {
      return refuse(error, field, item, "expected {\"Sequence\": {...}} or {\"SpecialToken\": {...}}");
    }
  }
  if (!seen_sequence) return refuse(error, "post_processor.single", single, "the template has no sequence $A");
  return true;
}

inline bool BpeTokenizer::load_decoder(JsonValue v, const std::string& where, std::string* error) {
  using bpe_detail::refuse;
  if (!v.valid() || v.is_null()) return true;
  if (!v.is_object()) return refuse(error, where, v, "expected an object or null");
  has_decoder_ = true;
  const JsonValue type = v.get("type");
  const std::string_view name = type.str();
  if (name == "Sequence") {
    const JsonValue list = v.get("decoders");
    if (!list.is_array()) return refuse(error, where + ".decoders", list, "expected an array");
    std::size_t i = 0;
    for (JsonValue d = list.first(); d.valid(); d = d.next(), ++i) {
      const std::string field = where + ".decoders[" + std::to_string(i) + "]";
      if (d.get("type").str() == "Sequence") return refuse(error, field + ".type", d.get("type"), "nested Sequences are not supported");
      if (!load_decoder(d, field, error)) return false;
    }
    return true;
  }
  DecodeStep step{DecodeKind::kFuse, "", "", 0, 0};
  if (name == "Replace") {
    step.kind = DecodeKind::kReplace;
    if (!bpe_detail::string_pattern(v.get("pattern"), where + ".pattern", &step.pattern, error)) return false;
    const JsonValue content = v.get("content");
    if (!content.is_string()) return refuse(error, where + ".content", content, "expected a string");
    step.content = std::string(content.str());
  } else if (name == "ByteFallback") {
    step.kind = DecodeKind::kByteFallback;
  } else if (name == "Fuse") {
    step.kind = DecodeKind::kFuse;
  } else if (name == "Strip") {
    step.kind = DecodeKind::kStrip;
    const JsonValue content = v.get("content");
    if (!content.is_string() || content.str().empty() ||
        bpe_detail::utf8_len(static_cast<unsigned char>(content.str()[0])) != content.str().size()) {
      return refuse(error, where + ".content", content, "expected one character");
    }
    step.content = std::string(content.str());
    if (!v.get("start").as_int64(0, 1 << 20, &step.start)) return refuse(error, where + ".start", v.get("start"), "expected an integer in [0, 2^20]");
    if (!v.get("stop").as_int64(0, 1 << 20, &step.stop)) return refuse(error, where + ".stop", v.get("stop"), "expected an integer in [0, 2^20]");
  } else {
    return refuse(error, where + ".type", type,
                  "supported decoders: Replace, ByteFallback, Fuse, Strip, Sequence of those, or null");
  }
  decoder_.push_back(std::move(step));
  return true;
}

// --- encoding ---------------------------------------------------------------------------

namespace bpe_detail {

// `in` with every non-overlapping occurrence of `pattern` (left to right) replaced by `content`.
inline std::string replace_all(std::string_view in, std::string_view pattern, std::string_view content) {
  std::string out;
  out.reserve(in.size());
  std::size_t at = 0;
  for (;;) {
    const std::size_t hit = in.find(pattern, at);
    if (hit == std::string_view::npos) break;
    out.append(in.data() + at, hit - at);
    out.append(content.data(), content.size());
    at = hit + pattern.size();
  }
  out.append(in.data() + at, in.size() - at);
  return out;
}

}  // namespace bpe_detail

inline void BpeTokenizer::normalize(std::string_view in, std::string* out) const {
  *out = std::string(in);
  for (const NormStep& step : normalizer_) {
    if (step.kind == NormKind::kReplace) {
      *out = bpe_detail::replace_all(*out, step.pattern, step.content);
    } else if (!out->empty()) {  // Prepend: only to a non-empty text, as tokenizers does
      *out = step.content + *out;
    }
  }
}

inline void BpeTokenizer::pre_tokenize(std::string_view in, std::vector<std::string_view>* words) const {
  words->clear();
  if (!split_) {
    if (!in.empty()) words->push_back(in);
    return;
  }
  auto push = [&](std::size_t from, std::size_t to) {
    if (to > from) words->push_back(in.substr(from, to - from));
  };
  const std::size_t plen = split_pattern_.size();
  std::size_t piece = 0;  // where the piece being built starts
  std::size_t at = 0;
  for (;;) {
    const std::size_t hit = in.find(split_pattern_, at);
    if (hit == std::string_view::npos) break;
    switch (split_behavior_) {
      case SplitBehavior::kRemoved:
        push(piece, hit);
        piece = hit + plen;
        break;
      case SplitBehavior::kIsolated:
        push(piece, hit);
        push(hit, hit + plen);
        piece = hit + plen;
        break;
      case SplitBehavior::kMergedWithPrevious:
        push(piece, hit + plen);
        piece = hit + plen;
        break;
      case SplitBehavior::kMergedWithNext:
        push(piece, hit);
        piece = hit;
        break;
    }
    at = hit + plen;
  }
  push(piece, in.size());
}

inline bool BpeTokenizer::encode_word(std::string_view word, std::vector<std::int32_t>* ids, std::string* error) const {
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      return true;
    }
  }
  // The word's symbols: characters, byte tokens or unk, linked for merging.
  struct Symbol {
    std::int32_t id, prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](std::int32_t id) {
    const auto n = static_cast<std::int32_t>(symbols.size());
    if (n > 0) symbols.back().next = n;
    symbols.push_back(Symbol{id, n - 1, -1, true});
  };
  bool last_unk = false;
  std::string ch;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t len = bpe_detail::utf8_len(static_cast<unsigned char>(word[i]));
    ch.assign(word.data() + i, len < word.size() - i ? len : word.size() - i);
    i += ch.size();
    auto it = vocab_.find(ch);
    if (it != vocab_.end()) {
      add(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char b : ch) all = all && byte_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (const char b : ch) add(byte_ids_[static_cast<unsigned char>(b)]);
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unk token: tokenizers drops the character
    if (!(fuse_unk_ && last_unk)) add(unk_id_);
    last_unk = true;
  }
  // Merges by rank, the lowest first and the leftmost on a tie (tokenizers' Word::merge_all).
  struct Candidate {
    std::uint32_t rank;
    std::int32_t pos, id;
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate> queue;
  auto offer = [&](std::int32_t left) {
    const std::int32_t right = symbols[static_cast<std::size_t>(left)].next;
    if (right < 0) return;
    auto m = merges_.find(pair_key(symbols[static_cast<std::size_t>(left)].id, symbols[static_cast<std::size_t>(right)].id));
    if (m != merges_.end()) queue.push(Candidate{m->second.rank, left, m->second.id});
  };
  for (std::size_t i = 0; i + 1 < symbols.size(); ++i) offer(static_cast<std::int32_t>(i));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    auto m = merges_.find(pair_key(left.id, right.id));
    if (m == merges_.end() || m->second.id != top.id) continue;  // stale: a neighbour merged first
    left.id = top.id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
  (void)error;
  return true;
}

inline std::int32_t BpeTokenizer::trie_longest(std::string_view text, std::size_t at, std::size_t* len) const {
  std::int32_t node = 0, found = -1;
  for (std::size_t i = at; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::int32_t child = -1;
    for (const auto& e : trie_[static_cast<std::size_t>(node)].children) {
      if (e.first == c) {
        child = e.second;
        break;
      }
    }
    if (child < 0) break;
    node = child;
    if (trie_[static_cast<std::size_t>(node)].token >= 0) {
      found = trie_[static_cast<std::size_t>(node)].token;
      *len = i + 1 - at;
    }
  }
  return found;
}

inline bool BpeTokenizer::encode(std::string_view text, bool add_special_tokens, std::vector<std::int32_t>* ids,
                                 std::string* error) const {
  ids->clear();
  const std::size_t bad = utf8_invalid_at(text);
  if (bad != text.size()) {
    *error = "the text is not valid UTF-8 at byte " + std::to_string(bad);
    return false;
  }
  if (add_special_tokens) ids->insert(ids->end(), prefix_ids_.begin(), prefix_ids_.end());
  std::string normalized;
  std::vector<std::string_view> words;
  auto encode_piece = [&](std::string_view piece) {
    if (piece.empty()) return true;
    normalize(piece, &normalized);
    pre_tokenize(normalized, &words);
    for (const std::string_view w : words) {
      if (!encode_word(w, ids, error)) return false;
    }
    return true;
  };
  std::size_t piece = 0;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t len = 0;
    const std::int32_t added = trie_.size() > 1 ? trie_longest(text, at, &len) : -1;
    if (added < 0) {
      ++at;
      continue;
    }
    if (!encode_piece(text.substr(piece, at - piece))) return false;
    ids->push_back(added);
    at += len;
    piece = at;
  }
  if (!encode_piece(text.substr(piece))) {
    ids->clear();
    return false;
  }
  if (add_special_tokens) ids->insert(ids->end(), suffix_ids_.begin(), suffix_ids_.end());
  return true;
}

// --- decoding ---------------------------------------------------------------------------

inline bool BpeTokenizer::decode(const std::int32_t* ids, std::size_t n, bool skip_special_tokens, std::string* text,
                                 std::string* error) const {
  text->clear();
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || id_to_token_[static_cast<std::size_t>(id)].empty()) {
      *error = "token id " + std::to_string(id) + " (at " + std::to_string(i) + ") is not in the tokenizer's vocabulary";
      if (id < 0 || id >= vocab_size()) *error += " [0, " + std::to_string(vocab_size()) + ")";
      return false;
    }
    if (skip_special_tokens && special_[static_cast<std::size_t>(id)]) continue;
    tokens.push_back(id_to_token_[static_cast<std::size_t>(id)]);
  }
  for (const DecodeStep& step : decoder_) {
    switch (step.kind) {
      case DecodeKind::kReplace:
        for (std::string& t : tokens) t = bpe_detail::replace_all(t, step.pattern, step.content);
        break;
      case DecodeKind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecodeKind::kStrip:
        for (std::string& t : tokens) {
          std::size_t from = 0, to = t.size();
          const std::size_t c = step.content.size();
          for (std::int64_t k = 0; k < step.start && to - from >= c && t.compare(from, c, step.content) == 0; ++k) from += c;
          for (std::int64_t k = 0; k < step.stop && to - from >= c && t.compare(to - c, c, step.content) == 0; ++k) to -= c;
          t = t.substr(from, to - from);
        }
        break;
      case DecodeKind::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        std::size_t n_bytes = 0;
        auto flush = [&]() {
          if (n_bytes == 0) return;
          if (utf8_invalid_at(bytes) == bytes.size()) {
            out.push_back(bytes);
          } else {
            for (std::size_t k = 0; k < n_bytes; ++k) out.emplace_back("\xEF\xBF\xBD");  // U+FFFD
          }
          bytes.clear();
          n_bytes = 0;
        };
        auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        };
        for (std::string& t : tokens) {
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && hex(t[3]) >= 0 && hex(t[4]) >= 0) {
            bytes.push_back(static_cast<char>(hex(t[3]) * 16 + hex(t[4])));
            ++n_bytes;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
    }
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0 && !has_decoder_) *text += ' ';
    *text += tokens[i];
  }
  return true;
}

}  // namespace et
}  // namespace kvcore
