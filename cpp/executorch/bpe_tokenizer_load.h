// BpeTokenizer's loading (bpe_tokenizer.h declares the class): tokenizer.json's model,
// added tokens, normalizer, pre-tokenizer, post-processor and decoder read into its tables,
// anything this reader does not support refused with the field, its value and the rule.
// Included by bpe_tokenizer.h after the class; not a header of its own to include.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bpe_tokenizer.h"
#include "json_reader.h"

namespace kvcore {
namespace et {

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

}  // namespace et
}  // namespace kvcore
