#include "agent/model.h"

#include <string.h>  // explicit_bzero

#include <algorithm>
#include <thread>

#include "agent/http.h"
#include "agent/wire.h"
#include "util/log.h"

namespace trybox::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using Deadline = std::optional<steady_clock::time_point>;

constexpr auto kReplace = Json::error_handler_t::replace;

// The truncation guard (docs/protocol/model.md): a token is rarely more than 4-5 bytes of
// prose or code, so a provider that counts under one token per 16 bytes of a large request
// did not read all of it.
constexpr int64_t kGuardMinBytes = 16 * 1024;
constexpr int64_t kGuardBytesPerToken = 16;
// The probe's text is controlled (number words, about 4 bytes a token), so it is held to a
// tighter bound.
constexpr size_t kProbeBytes = 64 * 1024;
constexpr int64_t kProbeBytesPerToken = 8;

constexpr milliseconds kFirstBackoff{500};
constexpr milliseconds kMaxWait{60000};

std::string Seconds(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

bool Retryable(int status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504 ||
         status == 529;
}

// The request's endpoint: the URL, the headers and the credential (shared, not copied).
HttpPost Endpoint(const Wire& wire, const ModelSettings& s) {
  HttpPost post;
  post.url = wire.Url();
  post.headers = wire.Headers();
  if (s.has_key()) {
    post.credential = s.api_key;
    post.credential_head = wire.CredentialHead();
  }
  post.ca_file = s.ca_file;
  return post;
}

// English number words: distinct, ordinary text for the probe.
std::string NumberWords(int n) {
  static const char* kOnes[] = {"zero",    "one",     "two",       "three",    "four",
                                "five",    "six",     "seven",     "eight",    "nine",
                                "ten",     "eleven",  "twelve",    "thirteen", "fourteen",
                                "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
  static const char* kTens[] = {"",      "",      "twenty",  "thirty", "forty",
                                "fifty", "sixty", "seventy", "eighty", "ninety"};
  if (n < 20) return kOnes[n];
  if (n < 100) return std::string(kTens[n / 10]) + (n % 10 ? std::string("-") + kOnes[n % 10] : "");
  if (n < 1000) {
    return std::string(kOnes[n / 100]) + " hundred" + (n % 100 ? " " + NumberWords(n % 100) : "");
  }
  return NumberWords(n / 1000) + " thousand" + (n % 1000 ? " " + NumberWords(n % 1000) : "");
}

std::string ProbePrompt() {
  std::string p =
      "This is a start-up check of your context window. Below are numbered lines; read them "
      "all, then reply with the single word OK and nothing else.\n\n";
  for (int i = 1; p.size() < kProbeBytes; ++i) {
    p += "line " + std::to_string(i) + ": " + NumberWords(i * 7 + 3) + "\n";
  }
  p += "\nReply with the single word OK.";
  return p;
}

class Client : public ModelClient {
 public:
  Client(ModelSettings s, std::unique_ptr<Wire> wire, std::unique_ptr<HttpTransport> http)
      : s_(std::move(s)), wire_(std::move(wire)), http_(std::move(http)) {}

  Outcome Send(const std::string& system, const std::vector<Entry>& transcript,
               const std::vector<ToolSpec>& tools, Deadline deadline) override {
    Outcome out =
        Exchange(wire_->Request(system, transcript, tools, s_.max_output_tokens), deadline);
    if (!out.ok()) return out;
    int64_t tokens = out.reply.usage.input_tokens;
    // Zero means the provider did not report usage (only OpenAI-compatible servers may
    // omit it): nothing to check here; Probe() refuses such a server.
    if (tokens > 0 && out.request_bytes >= kGuardMinBytes &&
        tokens * kGuardBytesPerToken < out.request_bytes) {
      out.failure = Failure::kContextTruncated;
      out.message = Who() + ": sent " + std::to_string(out.request_bytes) +
                    " bytes, provider counted " + std::to_string(tokens) +
                    " input tokens (under one per " + std::to_string(kGuardBytesPerToken) +
                    " bytes): its context window is smaller than the prompt and it dropped "
                    "the rest without saying so (for Ollama, raise num_ctx)";
    }
    return Finish(std::move(out));
  }

  Outcome Probe(Deadline deadline) override {
    Entry ask{Entry::Kind::kUser, ProbePrompt(), {}, {}};
    Outcome out = Exchange(wire_->Request("", {ask}, {}, 16), deadline);
    if (!out.ok()) return out;
    int64_t tokens = out.reply.usage.input_tokens;
    int64_t expected = out.request_bytes / kProbeBytesPerToken;
    if (tokens == 0) {
      out.failure = Failure::kProtocol;
      out.message = Who() + ": probe: the reply reports no input token count (usage." +
                    (s_.provider == "openai" ? "prompt_tokens" : "input_tokens") +
                    "), so a silently truncated prompt could not be told apart; use a server "
                    "that reports usage";
    } else if (tokens < expected) {
      out.failure = Failure::kContextTruncated;
      out.message = Who() + ": probe: sent " + std::to_string(out.request_bytes) +
                    " bytes, provider counted " + std::to_string(tokens) +
                    " tokens (expected at least " + std::to_string(expected) +
                    "): its context window is smaller than the prompt and it truncates "
                    "silently (for Ollama, raise num_ctx)";
    }
    return Finish(std::move(out));
  }

  const ModelSettings& settings() const override { return s_; }

 private:
  std::string Who() const { return s_.provider + " model " + s_.model; }

  Outcome Finish(Outcome out) const {
    out.message = ScrubKey(std::move(out.message), s_);
    return out;
  }

  // One attempt's result, before deciding whether to retry.
  struct Attempt {
    Failure failure = Failure::kNone;
    std::string message;
    bool retry = false;
    std::optional<milliseconds> asked_wait;
  };

  Attempt Classify(const Result<HttpResponse>& r, int status, bool deadline_bound,
                   Reply* reply) const {
    Attempt a;
    if (!r.ok()) {
      if (r.status().code() == Code::kDeadlineExceeded) {
        a.failure = Failure::kTimeout;
        a.message = Who() + ": no reply within " +
                    (deadline_bound ? std::string("the caller's deadline")
                                    : "request_timeout (" + Seconds(s_.request_timeout) + ")") +
                    ": " + r.status().message();
      } else {
        a.failure = Failure::kTransport;
        a.message = Who() + ": transport: " + r.status().message();
        a.retry = true;
      }
      return a;
    }
    const HttpResponse& resp = *r;
    std::string http = Who() + ": HTTP " + std::to_string(status);
    if (status >= 200 && status < 300) {
      Json body = Json::parse(resp.body, nullptr, false);
      if (body.is_discarded() || !body.is_object()) {
        a.failure = Failure::kProtocol;
        a.message = http + ": the reply is not a JSON object: " + Printable(resp.body, 200);
        return a;
      }
      auto parsed = wire_->ParseReply(body);
      if (!parsed.ok()) {
        a.failure = Failure::kProtocol;
        a.message = http + ": " + parsed.status().message();
        return a;
      }
      *reply = std::move(parsed).value();
      return a;
    }
    ProviderError err = wire_->ParseError(resp.body);
    a.message = http + ": " + (err.text.empty() ? "(empty body)" : err.text);
    if (status == 401 || status == 403) {
      a.failure = Failure::kAuth;
    } else if (status == 429) {
      a.failure = Failure::kRateLimited;
    } else if (status >= 500 && status < 600) {
      a.failure = Failure::kServer;
    } else if (status >= 400 && status < 500) {
      a.failure = err.context_overflow ? Failure::kContextOverflow : Failure::kBadRequest;
    } else {
      a.failure = Failure::kProtocol;
      a.message = http + ": unexpected status";
    }
    a.retry = Retryable(status);
    if (a.retry) a.asked_wait = RetryAfter(resp.headers);
    return a;
  }

  Outcome Exchange(const Json& request, Deadline deadline) {
    Outcome out;
    HttpPost post = Endpoint(*wire_, s_);
    post.body = request.dump(-1, ' ', false, kReplace);
    out.request_bytes = static_cast<int64_t>(post.body.size());
    for (int attempt = 1;; ++attempt) {
      post.timeout = s_.request_timeout;
      bool deadline_bound = false;
      if (deadline) {
        auto left = std::chrono::duration_cast<milliseconds>(*deadline - steady_clock::now());
        if (left <= milliseconds(0)) {
          out.failure = Failure::kTimeout;
          out.message = Who() + ": the deadline passed before the request was sent";
          return Finish(std::move(out));
        }
        if (left < post.timeout) {
          post.timeout = left;
          deadline_bound = true;
        }
      }
      out.attempts = attempt;
      auto r = http_->Post(post);
      out.http_status = r.ok() ? r->status : 0;
      Attempt a = Classify(r, out.http_status, deadline_bound, &out.reply);
      out.failure = a.failure;
      out.message = a.message;
      if (a.failure == Failure::kNone) return out;
      if (!a.retry || attempt >= s_.max_attempts) {
        if (attempt > 1) out.message += " (after " + std::to_string(attempt) + " attempts)";
        return Finish(std::move(out));
      }
      milliseconds wait = a.asked_wait.value_or(kFirstBackoff * (1 << std::min(attempt - 1, 10)));
      wait = std::min(wait, kMaxWait);
      // Never sleep past the deadline: give up now and say why, naming what went wrong last.
      if (deadline && steady_clock::now() + wait > *deadline) {
        out.failure = Failure::kTimeout;
        out.message = Who() + ": gave up after " + std::to_string(attempt) +
                      " attempts: the next retry (in " + Seconds(wait) +
                      ") would pass the deadline; last attempt: " + a.message;
        return Finish(std::move(out));
      }
      LogWarn("agent", ScrubKey(a.message + "; retrying in " + std::to_string(wait.count()) +
                                    " ms (attempt " + std::to_string(attempt) + " of " +
                                    std::to_string(s_.max_attempts) + ")",
                                s_));
      std::this_thread::sleep_for(wait);
    }
  }

  const ModelSettings s_;
  std::unique_ptr<Wire> wire_;
  std::unique_ptr<HttpTransport> http_;
};

Status CheckString(const Json& j, const char* name, bool required, std::string* out) {
  const Json* m = Member(j, name);
  if (m == nullptr || m->is_null()) {
    if (required) return InvalidArgument(std::string("model.") + name + " is missing");
    return Status::Ok();
  }
  if (!m->is_string()) return InvalidArgument(std::string("model.") + name + " is not a string");
  *out = m->get<std::string>();
  return Status::Ok();
}

}  // namespace

const char* FailureName(Failure f) {
  switch (f) {
    case Failure::kNone:
      return "none";
    case Failure::kTransport:
      return "transport";
    case Failure::kTimeout:
      return "timeout";
    case Failure::kAuth:
      return "auth";
    case Failure::kRateLimited:
      return "rate_limited";
    case Failure::kServer:
      return "server";
    case Failure::kBadRequest:
      return "bad_request";
    case Failure::kContextOverflow:
      return "context_overflow";
    case Failure::kContextTruncated:
      return "context_truncated";
    case Failure::kProtocol:
      return "protocol";
  }
  return "unknown";
}

Result<ModelSettings> ModelSettings::FromJson(const Json& j) {
  if (!j.is_object()) return InvalidArgument("model is not an object");
  ModelSettings s;
  RETURN_IF_ERROR(CheckString(j, "provider", true, &s.provider));
  RETURN_IF_ERROR(CheckString(j, "base_url", false, &s.base_url));
  if (const Json* key = Member(j, "api_key"); key != nullptr && !key->is_null()) {
    if (!key->is_string()) return InvalidArgument("model.api_key is not a string");
    // Read in place: the value goes from the request's string to its own pages, no copy.
    const std::string& text = key->get_ref<const std::string&>();
    // The key goes into a header line: a CR or LF in it would forge headers.
    for (unsigned char c : text) {
      if (c < 0x20 || c == 0x7f) return InvalidArgument("model.api_key contains a control byte");
    }
    if (!text.empty()) {
      ASSIGN_OR_RETURN(s.api_key, MakeModelKey(text));
    }
  }
  RETURN_IF_ERROR(CheckString(j, "model", true, &s.model));
  RETURN_IF_ERROR(CheckString(j, "ca_file", false, &s.ca_file));
  if (s.provider != "anthropic" && s.provider != "openai") {
    return InvalidArgument("model.provider '" + Printable(s.provider, 40) +
                           "' is not \"anthropic\" or \"openai\"");
  }
  if (s.model.empty()) return InvalidArgument("model.model is empty");
  if (s.base_url.empty()) {
    s.base_url =
        s.provider == "anthropic" ? "https://api.anthropic.com" : "https://api.openai.com/v1";
  }
  if (s.base_url.rfind("http://", 0) != 0 && s.base_url.rfind("https://", 0) != 0) {
    return InvalidArgument("model.base_url '" + Printable(s.base_url, 200) +
                           "' is not an http:// or https:// URL");
  }
  while (!s.base_url.empty() && s.base_url.back() == '/') s.base_url.pop_back();
  return s;
}

Json ModelSettings::Describe() const {
  return {{"provider", provider}, {"base_url", base_url}, {"model", model}, {"key_set", has_key()}};
}

Result<std::shared_ptr<const egress::SecretValue>> MakeModelKey(std::string_view value) {
  ASSIGN_OR_RETURN(auto key, egress::SecretValue::Copy(value));
  return std::make_shared<const egress::SecretValue>(std::move(key));
}

void WipeKey(Json* model) {
  if (model == nullptr || !model->is_object()) return;
  auto it = model->find("api_key");
  if (it == model->end() || !it->is_string()) return;
  std::string& text = it->get_ref<std::string&>();
  ::explicit_bzero(text.data(), text.size());
  text.clear();
}

std::string ScrubKey(std::string text, const ModelSettings& settings) {
  if (!settings.has_key()) return text;
  const std::string_view key = settings.api_key->view();
  for (size_t at; (at = text.find(key)) != std::string::npos;) {
    text.replace(at, key.size(), "[api key]");
  }
  return text;
}

namespace {

Result<std::unique_ptr<Wire>> WireFor(ModelSettings* settings) {
  if (settings->base_url.rfind("http://", 0) != 0 && settings->base_url.rfind("https://", 0) != 0) {
    return InvalidArgument("model base_url '" + Printable(settings->base_url, 200) +
                           "' is not an http:// or https:// URL");
  }
  while (settings->base_url.back() == '/') settings->base_url.pop_back();
  if (settings->model.empty()) return InvalidArgument("model name is empty");
  if (settings->max_attempts < 1) return InvalidArgument("model max_attempts is below 1");
  if (settings->provider == "anthropic") return MakeAnthropicWire(*settings);
  if (settings->provider == "openai") return MakeOpenAiWire(*settings);
  return InvalidArgument("unknown model provider '" + Printable(settings->provider, 40) + "'");
}

}  // namespace

Result<std::unique_ptr<ModelClient>> ModelClient::Make(const ModelSettings& given) {
  ASSIGN_OR_RETURN(auto http, HttpClient::Make());
  return Make(given, std::move(http));
}

Result<std::unique_ptr<ModelClient>> ModelClient::Make(const ModelSettings& given,
                                                       std::unique_ptr<HttpTransport> transport) {
  ModelSettings settings = given;
  ASSIGN_OR_RETURN(auto wire, WireFor(&settings));
  return std::unique_ptr<ModelClient>(
      std::make_unique<Client>(settings, std::move(wire), std::move(transport)));
}

Result<HttpPost> ModelEndpoint(const ModelSettings& given) {
  ModelSettings settings = given;
  ASSIGN_OR_RETURN(auto wire, WireFor(&settings));
  return Endpoint(*wire, settings);
}

}  // namespace trybox::agent
