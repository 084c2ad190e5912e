// kvcore-tokenize: BpeTokenizer (bpe_tokenizer.h) on the command line, for tests that
// compare it with Hugging Face tokenizers and for looking at a tokenizer.json by hand.
//
//   kvcore-tokenize TOKENIZER.json encode [--no-special]   < lines of hex-encoded UTF-8 text
//   kvcore-tokenize TOKENIZER.json decode [--skip-special] < lines of space-separated ids
//
// One output line per input line: encode prints the ids separated by spaces, decode the
// text's bytes in hex (lower case); a line the tokenizer refuses prints "error: MESSAGE".
// Hex keeps any text (newlines, invalid UTF-8) on one line.
// Exit status: 0; 1 when the tokenizer.json is refused (the message on stderr); 2 on bad usage.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bpe_tokenizer.h"

namespace {

int usage() {
  std::fprintf(stderr,
               "usage: kvcore-tokenize TOKENIZER.json encode [--no-special] | decode [--skip-special]\n"
               "  (stdin: one hex-encoded text or one line of space-separated ids per line)\n");
  return 2;
}

int hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

bool read_line(std::string* line) {
  line->clear();
  int c;
  while ((c = std::getchar()) != EOF && c != '\n') line->push_back(static_cast<char>(c));
  return c != EOF || !line->empty();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) return usage();
  const bool encode = std::strcmp(argv[2], "encode") == 0;
  if (!encode && std::strcmp(argv[2], "decode") != 0) return usage();
  bool flag = false;
  if (argc == 4) {
    if (std::strcmp(argv[3], encode ? "--no-special" : "--skip-special") != 0) return usage();
    flag = true;
  }
  kvcore::et::BpeTokenizer tokenizer;
  std::string error;
  if (!tokenizer.load_file(argv[1], &error)) {
    std::fprintf(stderr, "kvcore-tokenize: %s\n", error.c_str());
    return 1;
  }
  std::string line, text;
  std::vector<std::int32_t> ids;
  while (read_line(&line)) {
    bool ok = true;
    if (encode) {
      text.clear();
      for (std::size_t i = 0; ok && i < line.size(); i += 2) {
        const int hi = hex_digit(line[i]), lo = i + 1 < line.size() ? hex_digit(line[i + 1]) : -1;
        if (hi < 0 || lo < 0) {
          error = "the input line is not hex";
          ok = false;
        } else {
          text.push_back(static_cast<char>(hi * 16 + lo));
        }
      }
      ok = ok && tokenizer.encode(text, !flag, &ids, &error);
      if (ok) {
        for (std::size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
        std::printf("\n");
      }
    } else {
      ids.clear();
      for (const char* p = line.c_str(); ok && *p != '\0';) {
        char* end = nullptr;
        const long long v = std::strtoll(p, &end, 10);
        if (end == p || v < INT32_MIN || v > INT32_MAX) {
          error = "the input line is not space-separated integer ids";
          ok = false;
        } else {
          ids.push_back(static_cast<std::int32_t>(v));
          p = end;
          while (*p == ' ') ++p;
        }
      }
      ok = ok && tokenizer.decode(ids.data(), ids.size(), flag, &text, &error);
      if (ok) {
        for (const char c : text) std::printf("%02x", static_cast<unsigned char>(c));
        std::printf("\n");
      }
    }
    if (!ok) std::printf("error: %s\n", error.c_str());
  }
  return 0;
}
