// `evoattn bench`: forward and forward+backward timings, against docs/CONTRACT.md's floor on CUDA.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>

#include "args.h"
#include "attention_call.h"
#include "commands.h"
#include "errors.h"
#include "floor.h"
#include "random_inputs.h"
#include "timing.h"
#include "verify.h"

namespace evoattn::cli {

namespace {

const char* const kUsage =
    R"(usage: evoattn bench [--preset NAME | --suite] [--B N] [--N N] [--L N | --Lq N --Lk N]
                     [--H N] [--D N] [--bias mask,pair|mask|pair|none] [--dtype bf16|fp16|fp32]
                     [--backend auto|cpu|cuda] [--forward-only] [--verify] [--iters N]
                     [--warmup N] [--threads N] [--tf32] [--csv FILE]
                     [--peak-tflops X] [--peak-tbps X] [--clock-mhz X]

Times the forward, and the forward plus backward (gradients of q, k, v and the pair bias),
on random inputs. With no shape flags it runs the `small` preset (B1 N8 L64 H4 D32, mask and
pair bias), which takes a few seconds on the CPU.

  --preset NAME    one of the presets below; shape flags then override its sizes
  --suite          every docs/CONTRACT.md suite preset, in order
  --B/--N/--H/--D  sizes; --L sets Lq = Lk, or give --Lq and --Lk
  --bias B         which biases: mask (bias [B,N,1,1,Lk]), pair (bias [B,1,H,Lq,Lk]), both or none
  --dtype T        bf16 (default), fp16 or fp32 (IEEE; --tf32 allows TF32 tensor cores)
  --backend B      auto (cuda when available, else cpu), cpu or cuda
  --forward-only   time the forward alone (inference); the f+b columns show -
  --iters N        timed runs; the median is reported (default 5 on the CPU, 100 on CUDA)
  --warmup N       untimed runs first (default 1 on the CPU, 10 on CUDA)
  --threads N      CPU threads (default: all)
  --verify         also run each shape reduced to B=1, N<=2 and compare o, lse, dq, dk, dv
                   and d(pair_bias) with a float64 reference; exit code 1 on any FAIL
  --csv FILE       append one row per shape to FILE (a header first when it is empty); its
                   last columns add the host's median microseconds in the calls timed
  --peak-tflops X, --peak-tbps X, --clock-mhz X
                   the floor's dense bf16 rate, copy bandwidth and SM clock (default: the
                   H100 ceilings of docs/CONTRACT.md, 729 TFLOP/s, 3.02 TB/s, 1980 MHz)

On CUDA the table adds each time's ratio to docs/CONTRACT.md's floor and the extra device memory of
one forward+backward (LSE + workspace). Exit code 2 for bad flags.
Presets: )";

constexpr int64_t kMaxSize = int64_t{1} << 31;
constexpr uint64_t kSeed = 20261122;

struct Settings {
  std::vector<ProblemShape> shapes;
  evoattn_dtype_t dtype;
  evoattn_device_type_t device;
  evoattn_options_t options;
  int warmup, iters;
  bool forward_only;
  bool verify;
  DeviceRates rates;
  std::string csv_path;
};

std::vector<ProblemShape> shapes_from(const Args& args) {
  const bool custom = args.has("B") || args.has("N") || args.has("L") || args.has("Lq") ||
                      args.has("Lk") || args.has("H") || args.has("D");
  std::vector<ProblemShape> shapes;
  if (args.has("suite")) {
    if (args.has("preset") || custom)
      throw UsageError("--suite takes no --preset and no shape flags");
    shapes = suite_presets();
  } else {
    const std::string name = args.text("preset", small_preset().name);
    const std::optional<ProblemShape> preset = find_preset(name);
    if (!preset)
      throw UsageError("unknown preset '" + name + "' (expected one of " + preset_names() + ")");
    ProblemShape s = *preset;
    if (args.has("L") && (args.has("Lq") || args.has("Lk")))
      throw UsageError("give --L or --Lq/--Lk, not both");
    if (custom) s.name = "custom";
    s.B = args.integer("B", s.B, 1, kMaxSize);
    s.N = args.integer("N", s.N, 1, kMaxSize);
    if (args.has("L")) s.Lq = s.Lk = args.integer("L", 0, 1, kMaxSize);
    s.Lq = args.integer("Lq", s.Lq, 1, kMaxSize);
    s.Lk = args.integer("Lk", s.Lk, 1, kMaxSize);
    s.H = args.integer("H", s.H, 1, kMaxSize);
    s.D = args.integer("D", s.D, 1, 128);
    shapes.push_back(s);
  }
  if (args.has("bias")) {
    const std::string bias =
        args.choice("bias", "", {"mask,pair", "pair,mask", "mask", "pair", "none"});
    for (ProblemShape& s : shapes) {
      s.mask_bias = bias.find("mask") != std::string::npos;
      s.pair_bias = bias.find("pair") != std::string::npos;
    }
  }
  return shapes;
}

Settings settings_from(const Args& args) {
  Settings s;
  s.shapes = shapes_from(args);
  s.dtype = dtype_from_name(args.choice("dtype", "bf16", {"bf16", "fp16", "fp32"}));
  s.device = choose_device(args.choice("backend", "auto", {"auto", "cpu", "cuda"}));
  const bool cuda = s.device == EVOATTN_DEVICE_CUDA;
  s.warmup = static_cast<int>(args.integer("warmup", cuda ? 10 : 1, 0, 1 << 20));
  s.iters = static_cast<int>(args.integer("iters", cuda ? 100 : 5, 1, 1 << 20));
  s.forward_only = args.has("forward-only");
  s.verify = args.has("verify");
  evoattn_options_init(&s.options);
  s.options.allow_tf32 = args.has("tf32") ? 1 : 0;
  s.options.num_threads = static_cast<int32_t>(args.integer("threads", 0, 1, 1 << 16));
  s.rates.tflops = args.positive_number("peak-tflops", s.rates.tflops);
  s.rates.tbps = args.positive_number("peak-tbps", s.rates.tbps);
  s.rates.clock_mhz = args.positive_number("clock-mhz", s.rates.clock_mhz);
  s.csv_path = args.text("csv", "");
  return s;
}

struct Row {
  ProblemShape shape;
  double fwd_ms, fb_ms;
  double fwd_host_us, fb_host_us;  // the host's time in the calls (CSV only)
  double fwd_flops, fb_flops;
  double fwd_floor_ms, fb_floor_ms;  // CUDA only
  size_t extra_bytes;
};

std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* pattern, ...) {
  char buffer[512];
  va_list args;
  va_start(args, pattern);
  std::vsnprintf(buffer, sizeof buffer, pattern, args);
  va_end(args);
  return buffer;
}

// Throughput: GFLOP/s on the CPU, TFLOP/s on CUDA.
double rate(double flops, double ms, bool cuda) {
  return flops / (ms * 1e-3) / (cuda ? 1e12 : 1e9);
}

void print_header(std::ostream& out, const Settings& s, const Timer& timer) {
  const bool cuda = s.device == EVOATTN_DEVICE_CUDA;
  out << "evoattn " << evoattn_version_string() << " bench on " << timer.description() << ", "
      << util::dtype_name(s.dtype) << (s.options.allow_tf32 ? " (tf32)" : "") << ", median of "
      << s.iters << " runs after " << s.warmup << " warm-up\n";
  if (cuda) {
    out << format("floor rates: %.0f TFLOP/s, %.2f TB/s, %.0f MHz, %d SMs\n", s.rates.tflops,
                  s.rates.tbps, s.rates.clock_mhz, s.rates.sms);
  }
  const char* unit = cuda ? "TFLOP/s" : "GFLOP/s";
  out << format("%-42s %-7s %-5s %10s %12s %10s %12s", "shape", "backend", "dtype", "fwd ms",
                (std::string("fwd ") + unit).c_str(), "f+b ms",
                (std::string("f+b ") + unit).c_str());
  if (cuda) out << format(" %9s %9s %9s", "fwd/floor", "f+b/floor", "extra MB");
  out << '\n';
}

// Milliseconds to four significant digits in fixed notation (0.02251, 0.3529, 8.032, 17.28):
// three decimals hid a 4% change on the shortest suite shape.
std::string ms_text(double ms) {
  int decimals = 3;
  if (ms > 0.0 && std::isfinite(ms)) decimals = std::clamp(3 - static_cast<int>(std::floor(std::log10(ms))), 0, 6);
  return format("%.*f", decimals, ms);
}

void print_row(std::ostream& out, const Settings& s, const Row& r) {
  const bool cuda = s.device == EVOATTN_DEVICE_CUDA;
  const std::string shape = r.shape.name + " " + r.shape.dims() + " " + r.shape.biases();
  out << format("%-42s %-7s %-5s %10s %12.2f", shape.c_str(), device_name(s.device), util::dtype_name(s.dtype),
                ms_text(r.fwd_ms).c_str(), rate(r.fwd_flops, r.fwd_ms, cuda));
  if (s.forward_only) {
    out << format(" %10s %12s", "-", "-");
  } else {
    out << format(" %10s %12.2f", ms_text(r.fb_ms).c_str(), rate(r.fb_flops, r.fb_ms, cuda));
  }
  if (cuda) {
    out << format(" %9.2f", r.fwd_ms / r.fwd_floor_ms);
    out << (s.forward_only ? format(" %9s", "-") : format(" %9.2f", r.fb_ms / r.fb_floor_ms));
    out << format(" %9.1f", r.extra_bytes / 1e6);
  }
  out << std::endl;  // rows appear as they finish
}

void print_verification(std::ostream& out, const Verification& v) {
  out << "  verify " << v.shape.dims() << ":";
  for (const auto& [name, error] : v.errors) out << format(" %s %.2e", name.c_str(), error);
  out << format("  bound %.0e  %s", v.bound, v.passed ? "PASS" : "FAIL") << std::endl;
}

const char* kCsvHeader =
    "name,B,N,Lq,Lk,H,D,biases,backend,device,dtype,tf32,fwd_ms,fwd_tflops,fb_ms,fb_tflops,"
    "fwd_floor_ms,fb_floor_ms,extra_bytes,verify,fwd_host_us,fb_host_us";

void append_csv(std::ofstream& csv, const Settings& s, const Timer& timer, const Row& r,
                const std::string& verdict) {
  const ProblemShape& p = r.shape;
  const bool cuda = s.device == EVOATTN_DEVICE_CUDA;
  std::string device = timer.description();
  for (char& c : device) c = c == ',' ? ';' : c;
  csv << p.name << ',' << p.B << ',' << p.N << ',' << p.Lq << ',' << p.Lk << ',' << p.H << ','
      << p.D << ',' << p.biases() << ',' << device_name(s.device) << ',' << device << ','
      << util::dtype_name(s.dtype) << ',' << s.options.allow_tf32 << ','
      << format("%.6g,%.6g,", r.fwd_ms, rate(r.fwd_flops, r.fwd_ms, true));
  // --forward-only leaves the f+b fields empty.
  const auto fb_field = [&](double value) { return s.forward_only ? std::string() : format("%.6g", value); };
  csv << fb_field(r.fb_ms) << ',' << fb_field(rate(r.fb_flops, r.fb_ms, true)) << ',';
  if (cuda) {
    csv << format("%.6g,", r.fwd_floor_ms) << fb_field(r.fb_floor_ms) << format(",%zu", r.extra_bytes);
  } else {
    csv << ",,";
  }
  csv << ',' << verdict << format(",%.1f,", r.fwd_host_us) << fb_field(r.fb_host_us) << '\n';
  csv.flush();
}

Row measure(const ProblemShape& shape, const Settings& s, Timer& timer, std::mt19937_64& rng) {
  const HostInputs inputs = random_inputs(shape, s.dtype, rng);
  // Bias gradients in the compute dtype, as a framework would return them.
  const AttentionCall call(inputs, s.device, s.options,
                           GradRequest{false, shape.pair_bias, s.dtype});
  void* stream = timer.stream();
  double fwd_host_us = 0, fb_host_us = std::numeric_limits<double>::quiet_NaN();
  const double fwd_ms = timer.median_ms([&] { call.forward(stream); }, s.warmup, s.iters, &fwd_host_us);
  const double fb_ms = s.forward_only ? std::numeric_limits<double>::quiet_NaN()
                                      : timer.median_ms(
                                            [&] {
                                              call.forward(stream);
                                              call.backward(stream);
                                            },
                                            s.warmup, s.iters, &fb_host_us);
  const size_t elem = util::dtype_size(s.dtype);
  const Work fwd = forward_work(shape, elem), fb = forward_backward_work(shape, elem);
  return Row{shape,
             fwd_ms,
             fb_ms,
             fwd_host_us,
             fb_host_us,
             fwd.flops,
             fb.flops,
             floor_ms(fwd, s.rates),
             floor_ms(fb, s.rates),
             call.extra_bytes()};
}

}  // namespace

std::string bench_usage() { return kUsage + preset_names() + "\n"; }

int bench_command(const std::vector<std::string>& words, std::ostream& out) {
  const Args args(words,
                  {"preset", "B", "N", "L", "Lq", "Lk", "H", "D", "dtype", "bias", "backend",
                   "iters", "warmup", "threads", "csv", "peak-tflops", "peak-tbps", "clock-mhz"},
                  {"suite", "forward-only", "verify", "tf32", "help"});
  if (args.has("help")) {
    out << bench_usage();
    return 0;
  }
  if (!args.positional().empty())
    throw UsageError("unexpected argument '" + args.positional()[0] + "'");
  Settings s = settings_from(args);
  std::ofstream csv;
  if (!s.csv_path.empty()) {
    csv.open(s.csv_path, std::ios::app);
    if (!csv) throw InputError(s.csv_path + ": cannot open for appending");
    if (std::filesystem::file_size(s.csv_path) == 0) csv << kCsvHeader << '\n';
  }

  Timer timer(s.device);
  if (timer.multiprocessors() > 0) s.rates.sms = timer.multiprocessors();
  print_header(out, s, timer);
  std::mt19937_64 rng(kSeed);
  bool all_passed = true;
  for (const ProblemShape& shape : s.shapes) {
    const Row row = measure(shape, s, timer, rng);
    print_row(out, s, row);
    std::string verdict;
    if (s.verify) {
      const Verification v = verify_reduced(shape, s.dtype, s.device, s.options, rng);
      print_verification(out, v);
      all_passed = all_passed && v.passed;
      verdict = v.passed ? "PASS" : "FAIL";
    }
    if (csv.is_open()) append_csv(csv, s, timer, row, verdict);
  }
  return all_passed ? 0 : 1;
}

}  // namespace evoattn::cli
