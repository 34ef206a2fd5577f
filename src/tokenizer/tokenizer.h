// The tokenizer facade: vocabulary, special tokens, encode / decode, built from GGUF metadata.
//
//   tokenizer.ggml.model   "llama" -> SentencePiece-style BPE (spm.h), "gpt2" -> byte-level BPE
//                          (bpe.h + pretokenizer.h); anything else -> specdec::Error
//   tokenizer.ggml.tokens / scores / token_type / merges, bos / eos / unknown / padding / eot /
//   eom ids, add_bos_token, add_eos_token, add_space_prefix, pre, chat_template.
//
// Behavior follows llama.cpp (llama-vocab.cpp), which the fixture tests check token for token:
// - encode: with parse_special, text that spells a control (or unknown) token becomes that
//   token; user-defined tokens are always recognized (like HF's added tokens). Recognition is
//   leftmost-longest. SPM: each text fragment gets a leading space when add_space_prefix and it
//   is the first fragment or follows a special token, spaces become U+2581, then BPE by score.
//   BPE: pre-tokenize, then merge by rank.
// - token_to_piece: the bytes a token stands for. Control, unknown and unused tokens give ""
//   (or their text when render_special); SPM U+2581 -> ' ', <0xAB> byte tokens -> that byte;
//   byte-level BPE code points -> their bytes; user-defined tokens -> their text as is;
//   undefined-type (0) tokens are treated as normal ones.
// - Byte-level BPE drops input bytes that have no token (SmolLM2 has none for 0xFF, 0xC0, ...)
//   before merging, as HF tokenizers does; llama.cpp drops them after merging, which can differ.
// - decode: the pieces concatenated. With SPM and add_space_prefix, a decode that starts the
//   text (DecodeOptions::text_start) drops one leading space of the first non-empty piece, the
//   one encode added, so decode(encode(s)) == s. The result is raw bytes and may hold invalid
//   UTF-8 (for example an emoji cut in the middle); see sanitize_utf8 in unicode.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "model/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/vocab.h"

namespace specdec {

class SpmModel;
class BpeModel;
class PreTokenizer;

enum class TokenizerKind {
  kSpm,  // tokenizer.ggml.model = "llama"
  kBpe,  // tokenizer.ggml.model = "gpt2"
};

struct DecodeOptions {
  // The ids start the text (not a continuation of text decoded before): SPM drops the leading
  // space that encode added. Use false to stream a continuation (generated tokens after a
  // prompt), where every piece is kept verbatim.
  bool text_start = true;
  // Control / unknown tokens render as their text (e.g. "<|im_end|>") instead of "".
  bool render_special = false;
};

class Tokenizer {
 public:
  // Reads the tokenizer.* metadata. Throws specdec::Error for a missing or malformed key (naming
  // it) and for an unsupported tokenizer.ggml.model or tokenizer.ggml.pre (naming the value).
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. add_special: BOS (and EOS) as the metadata's add_bos / add_eos say.
  // parse_special: text like "<|im_start|>" becomes its control token. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes token `id` contributes (see the file comment). Throws specdec::Error for an id
  // outside [0, n_vocab).
  const std::string& token_to_piece(int32_t id, bool render_special = false) const;
  std::string decode(std::span<const int32_t> ids, DecodeOptions options = {}) const;

  int32_t n_vocab() const { return vocab_.size(); }
  TokenizerKind kind() const { return kind_; }
  const std::string& model_name() const { return model_name_; }  // "llama" / "gpt2"
  const std::string& pre_name() const { return pre_name_; }      // "" for SPM
  // The token text as stored in the vocabulary (e.g. "▁Hello", "ĠHello", "<0x0A>").
  const std::string& token_text(int32_t id) const;
  TokenType token_type(int32_t id) const;
  float token_score(int32_t id) const;
  // The id of an exact token text, or nullopt.
  std::optional<int32_t> find_token(std::string_view text) const;

  int32_t bos_id() const { return bos_id_; }  // -1 when the model has none
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  int32_t unk_id() const { return unk_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // End of generation: EOS, EOT, EOM and tokens spelled like <|im_end|>, <|eot_id|>, <|end|>,
  // <|endoftext|>, <end_of_turn>, ... (llama.cpp's list).
  bool is_eog(int32_t id) const {
    return id >= 0 && id < n_vocab() && is_eog_[static_cast<size_t>(id)] != 0;
  }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }

  // The Jinja source of tokenizer.chat_template ("" when absent).
  const std::string& chat_template() const { return chat_template_; }
  // Renders messages with the model's template (see chat_template.h), with this vocabulary's
  // BOS / EOS texts. Encode the result with add_special = false, parse_special = true. Throws
  // specdec::Error when the model's template is not one we recognize.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                  bool add_generation_prompt) const;

  // For tests: the pre-tokenizer of byte-level BPE (nullptr for SPM).
  const PreTokenizer* pre_tokenizer() const { return pre_tokenizer_.get(); }

 private:
  Tokenizer();
  void init_special_tokens();
  // Encodes one fragment of plain text (no special tokens in it).
  void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t>* out) const;
  // Length of the special token at text[pos] (its id in *id), or 0.
  size_t match_special(std::string_view text, size_t pos, bool parse_special, int32_t* id) const;
  void check_id(int32_t id) const;

  TokenizerKind kind_ = TokenizerKind::kSpm;
  std::string model_name_;
  std::string pre_name_;
  Vocab vocab_;
  std::vector<std::string> pieces_;  // [n_vocab] token_to_piece without render_special
  std::unique_ptr<SpmModel> spm_;
  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;

  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t eot_id_ = -1;
  int32_t eom_id_ = -1;
  int32_t unk_id_ = -1;
  int32_t pad_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;

  std::vector<uint8_t> is_eog_;  // [n_vocab]
  std::vector<int32_t> eog_ids_;
  // Tokens that text can spell (control, user-defined, unknown), by first byte, longest first.
  std::vector<std::vector<int32_t>> special_by_first_byte_;  // [256][...]

  std::string chat_template_;
  std::optional<ChatTemplate> parsed_template_;
  std::string template_error_;  // why parsed_template_ is empty
};

}  // namespace specdec
