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

namespace bpe_detail {

// The number of UTF-8 bytes of the character starting with byte `c` (valid text).
inline std::size_t utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

}  // namespace bpe_detail

}  // namespace et
}  // namespace kvcore

// Loading (tokenizer.json into the tables above) lives in its own file.
#include "bpe_tokenizer_load.h"  // IWYU pragma: export

namespace kvcore {
namespace et {

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
