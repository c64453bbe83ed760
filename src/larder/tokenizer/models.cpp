// models.cpp — the two subword models.
//
// Both merge adjacent symbols through a priority queue keyed by (priority, position), with
// lazy invalidation of stale entries, so a piece of n characters costs O(n log n) whatever the
// vocabulary: SentencePiece-style tokenizers (Llama 2, Gemma) hand the whole input to the model
// as one piece, and a 100k-token prompt must not turn quadratic.
#include <algorithm>
#include <cstdio>
#include <queue>

#include "larder/tokenizer/pipeline.h"
#include "larder/tokenizer/utf8.h"

namespace larder::tokenizer::detail {

namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::string byte_token_name(unsigned b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "<0x%02X>", b);
  return buf;
}

// ------------------------------------------------------------------ rank BPE (HF semantics)

class BpeModel final : public Model {
 public:
  BpeModel(const StrIdMap& vocab, BpeConfig cfg) : vocab_(vocab), cfg_(std::move(cfg)) {
    for (unsigned b = 0; b < 256; ++b) {
      auto id = lookup(vocab_, byte_token_name(b));
      byte_ids_[b] = id ? *id : -1;
    }
  }

  bool add_merge(const std::string& a, const std::string& b, uint32_t rank, std::string* error) {
    auto ia = lookup(vocab_, a), ib = lookup(vocab_, b);
    const size_t plen = cfg_.continuing_subword_prefix.size();
    std::string merged = a;
    if (plen && b.compare(0, plen, cfg_.continuing_subword_prefix) == 0) merged += b.substr(plen);
    else merged += b;
    auto im = lookup(vocab_, merged);
    if (!ia || !ib || !im) {
      if (error) *error = "merge '" + a + " " + b + "' uses a token missing from the vocabulary";
      return false;
    }
    // A repeated pair keeps its last rank, as HF's map construction does.
    merges_[pair_key(*ia, *ib)] = {rank, *im};
    return true;
  }

  void tokenize(std::string_view w, std::vector<int32_t>& out) const override {
    if (w.empty()) return;
    if (cfg_.ignore_merges) {
      if (auto id = lookup(vocab_, w)) {
        out.push_back(*id);
        return;
      }
    }
    std::vector<Sym> syms;
    syms.reserve(w.size());
    auto add = [&](int32_t id, uint32_t len) {
      const int32_t idx = static_cast<int32_t>(syms.size());
      if (idx > 0) syms.back().next = idx;
      syms.push_back({id, idx - 1, -1, len});
    };
    bool has_unk = false;  // a pending unknown (fused across characters when fuse_unk)
    uint32_t unk_len = 0;
    std::string s;
    for (size_t i = 0; i < w.size();) {
      size_t n = utf8::char_len(w, i);
      if (n == 0) n = 1;  // cannot happen for valid input; keep the scan total anyway
      const bool first = i == 0, last = i + n >= w.size();
      s.assign(w.substr(i, n));
      if (!first && !cfg_.continuing_subword_prefix.empty()) s.insert(0, cfg_.continuing_subword_prefix);
      if (last && !cfg_.end_of_word_suffix.empty()) s += cfg_.end_of_word_suffix;
      const auto byte_len = static_cast<uint32_t>(n);
      i += n;
      if (auto id = lookup(vocab_, s)) {
        if (has_unk) {
          add(*cfg_.unk_id, unk_len);
          has_unk = false;
        }
        add(*id, byte_len);
        continue;
      }
      if (cfg_.byte_fallback) {
        bool all = true;
        for (unsigned char c : s) all = all && byte_ids_[c] >= 0;
        if (all) {
          // HF adds the bytes without flushing a pending unknown first; keep that order.
          for (unsigned char c : s) add(byte_ids_[c], 1);
          continue;
        }
      }
      if (cfg_.unk_id) {
        if (has_unk && cfg_.fuse_unk) {
          unk_len += byte_len;
        } else {
          if (has_unk) add(*cfg_.unk_id, unk_len);
          has_unk = true;
          unk_len = byte_len;
        }
      }
    }
    if (has_unk) add(*cfg_.unk_id, unk_len);
    merge_all(syms);
    for (const auto& sy : syms)
      if (sy.len) out.push_back(sy.id);
  }

 private:
  struct Sym {
    int32_t id, prev, next;
    uint32_t len;  // 0 = merged away
  };
  struct Cand {
    uint32_t rank;
    int32_t pos, new_id;
    // priority_queue pops the largest: make "lower rank, then lower position" the largest.
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };

  const std::pair<uint32_t, int32_t>* find_merge(int32_t a, int32_t b) const {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  }

  void merge_all(std::vector<Sym>& syms) const {
    if (syms.size() < 2) return;
    std::priority_queue<Cand> q;
    for (size_t i = 0; i + 1 < syms.size(); ++i)
      if (auto m = find_merge(syms[i].id, syms[i + 1].id))
        q.push({m->first, static_cast<int32_t>(i), m->second});
    while (!q.empty()) {
      const Cand top = q.top();
      q.pop();
      Sym& left = syms[top.pos];
      if (left.len == 0 || left.next < 0) continue;
      const int32_t rpos = left.next;
      Sym right = syms[rpos];
      auto m = find_merge(left.id, right.id);
      if (!m || m->second != top.new_id) continue;  // stale entry
      left.id = top.new_id;
      left.len += right.len;
      left.next = right.next;
      syms[rpos].len = 0;
      if (right.next >= 0) syms[right.next].prev = top.pos;
      if (left.prev >= 0)
        if (auto pm = find_merge(syms[left.prev].id, left.id)) q.push({pm->first, left.prev, pm->second});
      if (left.next >= 0)
        if (auto nm = find_merge(left.id, syms[left.next].id)) q.push({nm->first, top.pos, nm->second});
    }
  }

  const StrIdMap& vocab_;  // owned by the tokenizer, which outlives its model
  BpeConfig cfg_;
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges_;
  int32_t byte_ids_[256];
};

// ------------------------------------------------------------------ score BPE (SentencePiece)

class SpmModel final : public Model {
 public:
  SpmModel(const StrIdMap& vocab, const std::vector<float>& scores, std::optional<int32_t> unk)
      : vocab_(vocab), scores_(scores) {
    for (unsigned b = 0; b < 256; ++b) {
      auto id = lookup(vocab_, byte_token_name(b));
      if (!id) id = lookup(vocab_, std::string(1, static_cast<char>(b)));
      byte_ids_[b] = id ? *id : (unk ? *unk : -1);
    }
  }

  void tokenize(std::string_view text, std::vector<int32_t>& out) const override {
    if (text.empty()) return;
    std::vector<Sym> syms;
    for (size_t off = 0; off < text.size();) {
      const size_t n = std::min(text.size() - off, utf8::lead_len(static_cast<unsigned char>(text[off])));
      const int32_t idx = static_cast<int32_t>(syms.size());
      syms.push_back({off, n, idx - 1, off + n == text.size() ? -1 : idx + 1});
      off += n;
    }
    std::priority_queue<Bigram> q;
    auto try_add = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0) return;
      const std::string_view s = text.substr(syms[l].off, syms[l].n + syms[r].n);
      auto id = lookup(vocab_, s);
      if (!id) return;
      q.push({l, r, *id < static_cast<int32_t>(scores_.size()) ? scores_[*id] : 0.0f, s.size()});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);
    while (!q.empty()) {
      const Bigram bg = q.top();
      q.pop();
      Sym& l = syms[bg.left];
      Sym& r = syms[bg.right];
      if (l.n == 0 || r.n == 0 || l.n + r.n != bg.size) continue;  // stale
      l.n += r.n;
      r.n = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = bg.left;
      try_add(l.prev, bg.left);
      try_add(bg.left, l.next);
    }
    for (int32_t i = 0; i != -1; i = syms[i].next) {
      const std::string_view s = text.substr(syms[i].off, syms[i].n);
      if (auto id = lookup(vocab_, s)) {
        out.push_back(*id);
        continue;
      }
      // Pieces never merged into a vocabulary entry (single characters only) become bytes.
      for (unsigned char c : s)
        if (byte_ids_[c] >= 0) out.push_back(byte_ids_[c]);
    }
  }

 private:
  struct Sym {
    size_t off, n;
    int32_t prev, next;
  };
  struct Bigram {
    int32_t left, right;
    float score;
    size_t size;
    // Highest score first; ties go to the leftmost pair.
    bool operator<(const Bigram& o) const { return score != o.score ? score < o.score : left > o.left; }
  };
  const StrIdMap& vocab_;  // owned by the tokenizer, which outlives its model
  std::vector<float> scores_;
  int32_t byte_ids_[256];
};

}  // namespace

std::unique_ptr<Model> make_bpe(const StrIdMap& vocab,
                                const std::vector<std::pair<std::string, std::string>>& merges,
                                BpeConfig cfg, std::string* error) {
  auto m = std::make_unique<BpeModel>(vocab, std::move(cfg));
  for (size_t i = 0; i < merges.size(); ++i)
    // Strict (HF: a bad merge is a load error) when the caller wants the error; lenient
    // (llama.cpp: skip it) otherwise.
    if (!m->add_merge(merges[i].first, merges[i].second, static_cast<uint32_t>(i), error) && error)
      return nullptr;
  return m;
}

std::unique_ptr<Model> make_spm(const StrIdMap& vocab, const std::vector<float>& scores,
                                std::optional<int32_t> unk_id) {
  return std::make_unique<SpmModel>(vocab, scores, unk_id);
}

namespace {

// Greedy longest-match-first WordPiece over the GGUF form of a BERT vocabulary.
class WpmModel final : public Model {
 public:
  WpmModel(const StrIdMap& vocab, std::optional<int32_t> unk) : vocab_(vocab), unk_(unk) {
    for (const auto& [s, id] : vocab_) max_len_ = std::max(max_len_, s.size());
  }
  void tokenize(std::string_view w, std::vector<int32_t>& out) const override {
    if (w.empty()) return;
    // HF WordPiece: a word longer than max_input_chars_per_word (100) is one unknown token.
    size_t chars = 0;
    for (unsigned char c : w) chars += (c & 0xC0) != 0x80;
    const size_t mark = out.size();
    if (chars <= 100) {
      const std::string word = "\xE2\x96\x81" + std::string(w);
      for (size_t i = 0; i < word.size();) {
        size_t j = std::min(word.size(), i + max_len_);
        std::optional<int32_t> id;
        for (; j > i; --j)
          if ((id = lookup(vocab_, std::string_view(word).substr(i, j - i)))) break;
        if (!id) {
          out.resize(mark);  // no segmentation: the whole word is unknown
          break;
        }
        out.push_back(*id);
        i = j;
      }
    }
    if (out.size() == mark && unk_) out.push_back(*unk_);
  }

 private:
  const StrIdMap& vocab_;
  std::optional<int32_t> unk_;
  size_t max_len_ = 1;
};

}  // namespace

std::unique_ptr<Model> make_wpm(const StrIdMap& vocab, std::optional<int32_t> unk_id) {
  return std::make_unique<WpmModel>(vocab, unk_id);
}

}  // namespace larder::tokenizer::detail
