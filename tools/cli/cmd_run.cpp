// `evoattn run DIR`: the attention forward (and backward) on .npy files.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "args.h"
#include "attention_call.h"
#include "commands.h"
#include "errors.h"
#include "npy.h"

namespace evoattn::cli {

namespace {

const char* const kUsage =
    R"(usage: evoattn run DIR [--out DIR2] [--dtype fp16|bf16|fp32] [--scale X]
                        [--backend auto|cpu|cuda] [--threads N]

Runs the attention forward, and the backward when DIR holds do.npy, on .npy files.
Reads from DIR:
  q.npy, k.npy, v.npy  [B, N, Lq, H, D], [B, N, Lk, H, D], [B, N, Lk, H, D]  (required)
  mask_bias.npy        5-D, broadcastable to [B, N, H, Lq, Lk]; normally [B, N, 1, 1, Lk]
  mask.npy             bool [B, N, Lk], true = attend
  pair_bias.npy        5-D, broadcastable to [B, N, H, Lq, Lk]; normally [B, 1, H, Lq, Lk]
  do.npy               the gradient of o, shaped like q
  Floating-point files may be float16, float32 or float64.
Writes to DIR2, all float32:
  o.npy [B, N, Lq, H, D] and lse.npy [B, N, H, Lq]; with do.npy also dq.npy, dk.npy, dv.npy,
  and dmask_bias.npy / dpair_bias.npy shaped like the biases given.

  --out DIR2     output directory (default DIR; created if missing)
  --dtype T      compute dtype; inputs and biases are rounded to it (default fp32 when q.npy
                 is float32 or float64, fp16 when it is float16)
  --scale X      the score scale (default 1/sqrt(D))
  --backend B    auto (cuda when available, else cpu), cpu or cuda
  --threads N    CPU threads (default: all)

Any other .npy file in DIR (a misspelt mask_bias.npy, say) is not read, and draws a warning.
Inputs must be regular files (or links to them). Exit code 0 on success, 2 for bad flags or
bad input, 1 for any other failure; on failure no output file is written or replaced.
)";

namespace fs = std::filesystem;

// The .npy files `evoattn run` reads, and those it writes (found in DIR after a run in place).
const char* const kInputFiles[] = {"q.npy", "k.npy", "v.npy", "mask_bias.npy", "pair_bias.npy",
                                   "mask.npy", "do.npy"};
const char* const kOutputFiles[] = {"o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy",
                                    "dmask_bias.npy", "dpair_bias.npy"};

// Warns about each .npy file in `dir` that is neither an input nor an output: a typo such as
// mask_bais.npy would otherwise run silently without its mask.
void warn_unread_files(const fs::path& dir, std::ostream& err) {
  std::vector<std::string> unread;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".npy") continue;
    const auto is = [&](const char* known) { return name == known; };
    if (std::none_of(std::begin(kInputFiles), std::end(kInputFiles), is) &&
        std::none_of(std::begin(kOutputFiles), std::end(kOutputFiles), is)) {
      unread.push_back(name);
    }
  }
  std::sort(unread.begin(), unread.end());
  for (const std::string& name : unread) {
    err << "evoattn run: warning: " << (dir / name).string()
        << " is not an input and is not read (the inputs: q, k, v, mask_bias, pair_bias, mask, do)\n";
  }
}

std::optional<NpyArray> read_input(const fs::path& dir, const char* file, bool required) {
  const fs::path path = dir / file;
  std::error_code error;
  if (!fs::exists(fs::symlink_status(path, error))) {
    if (required)
      throw InputError(path.string() + ": missing (q.npy, k.npy and v.npy are required)");
    return std::nullopt;
  }
  // A link to nothing is an input given by mistake, not an input left out.
  if (!fs::exists(fs::status(path, error))) {
    throw InputError(path.string() + ": a symbolic link to nothing");
  }
  return read_npy(path.string());
}

util::Tensor to_tensor(const NpyArray& array, evoattn_dtype_t dtype, const fs::path& path) {
  if (array.shape.size() > 5) {
    throw InputError(path.string() + ": expected at most 5 dimensions, got " +
                     std::to_string(array.shape.size()));
  }
  for (int64_t size : array.shape) {
    if (size == 0) throw InputError(path.string() + ": the array is empty (a dimension of size 0)");
  }
  const bool want_bool = dtype == EVOATTN_BOOL;
  if (want_bool != (array.dtype == NpyDType::kBool)) {
    throw InputError(path.string() + ": expected " +
                     (want_bool ? "bool" : "float16, float32 or float64") + " data, got " +
                     npy_dtype_name(array.dtype));
  }
  util::Tensor t = util::Tensor::empty(array.shape, dtype);
  util::from_doubles(t.view, array.values());
  return t;
}

std::optional<util::Tensor> optional_tensor(const fs::path& dir, const char* file,
                                            evoattn_dtype_t dtype) {
  const std::optional<NpyArray> array = read_input(dir, file, false);
  if (!array) return std::nullopt;
  return to_tensor(*array, dtype, dir / file);
}

// `forced_dtype` is the --dtype flag; without it, q.npy's precision picks the dtype.
HostInputs load_inputs(const fs::path& dir, std::optional<evoattn_dtype_t> forced_dtype) {
  const NpyArray q = *read_input(dir, "q.npy", true);
  const evoattn_dtype_t dtype =
      forced_dtype.value_or(q.dtype == NpyDType::kFloat16 ? EVOATTN_FLOAT16 : EVOATTN_FLOAT32);
  return HostInputs{to_tensor(q, dtype, dir / "q.npy"),
                    to_tensor(*read_input(dir, "k.npy", true), dtype, dir / "k.npy"),
                    to_tensor(*read_input(dir, "v.npy", true), dtype, dir / "v.npy"),
                    optional_tensor(dir, "mask_bias.npy", dtype),
                    optional_tensor(dir, "pair_bias.npy", dtype),
                    optional_tensor(dir, "mask.npy", EVOATTN_BOOL),
                    optional_tensor(dir, "do.npy", dtype)};
}

// Writes the outputs all together or not at all: each under a temporary name first; then each
// file a name already holds is moved aside and the new one renamed into place. If any step
// fails, the new files are removed and the old ones put back, so the directory is as it was.
void write_outputs(const fs::path& dir,
                   const std::vector<std::pair<std::string, const util::Tensor*>>& outputs) {
  fs::create_directories(dir);
  const std::string pid = std::to_string(getpid());
  struct Slot {
    fs::path target, temporary, backup;
    bool backed_up = false, placed = false;
  };
  std::vector<Slot> slots;
  for (const auto& output : outputs) {
    const std::string& name = output.first;
    slots.push_back({dir / name, dir / ("." + name + ".tmp" + pid), dir / ("." + name + ".old" + pid)});
  }
  try {
    for (size_t i = 0; i < outputs.size(); ++i) {
      const util::Tensor host = outputs[i].second->to(EVOATTN_DEVICE_CPU);
      write_npy(slots[i].temporary.string(),
                make_npy(NpyDType::kFloat32, host.sizes(), util::to_doubles(host.view)));
    }
    for (Slot& s : slots) {
      const fs::file_status now = fs::symlink_status(s.target);  // a link is replaced, not followed
      if (fs::exists(now) && !fs::is_regular_file(now) && !fs::is_symlink(now)) {
        throw std::runtime_error(s.target.string() + ": exists and is not a regular file");
      }
    }
    for (Slot& s : slots) {
      if (fs::exists(fs::symlink_status(s.target))) {
        fs::rename(s.target, s.backup);
        s.backed_up = true;
      }
      fs::rename(s.temporary, s.target);
      s.placed = true;
    }
  } catch (...) {
    std::error_code ignored;
    for (Slot& s : slots) {
      if (s.placed) fs::remove(s.target, ignored);
      if (s.backed_up) fs::rename(s.backup, s.target, ignored);
      fs::remove(s.temporary, ignored);
    }
    throw;
  }
  std::error_code ignored;
  for (const Slot& s : slots) {
    if (s.backed_up) fs::remove(s.backup, ignored);
  }
}

}  // namespace

std::string run_usage() { return kUsage; }

int run_command(const std::vector<std::string>& words, std::ostream& out, std::ostream& err) {
  const Args args(words, {"out", "dtype", "scale", "backend", "threads"}, {"help"});
  if (args.has("help")) {
    out << kUsage;
    return 0;
  }
  if (args.positional().size() != 1) throw UsageError("expected one input directory");
  const fs::path dir = args.positional()[0];
  const fs::path out_dir = args.text("out", dir.string());
  const evoattn_device_type_t device =
      choose_device(args.choice("backend", "auto", {"auto", "cpu", "cuda"}));
  evoattn_options_t options;
  evoattn_options_init(&options);
  if (args.has("scale")) {
    options.has_scale = 1;
    options.scale = args.number("scale", 0.0);
  }
  options.num_threads = static_cast<int32_t>(args.integer("threads", 0, 1, 1 << 16));
  std::optional<evoattn_dtype_t> dtype;
  if (args.has("dtype"))
    dtype = dtype_from_name(args.choice("dtype", "", {"fp16", "bf16", "fp32"}));

  if (!fs::is_directory(dir)) throw InputError(dir.string() + ": not a directory");
  if (fs::exists(out_dir) && !fs::is_directory(out_dir)) {
    throw InputError(out_dir.string() + ": exists and is not a directory");
  }
  warn_unread_files(dir, err);
  const HostInputs inputs = load_inputs(dir, dtype);
  const AttentionCall call(inputs, device, options, GradRequest{true, true, EVOATTN_FLOAT32});
  call.forward(nullptr);
  std::vector<std::pair<std::string, const util::Tensor*>> outputs = {{"o.npy", &call.o},
                                                                      {"lse.npy", &call.lse}};
  if (call.d_o) {
    call.backward(nullptr);
    outputs.insert(outputs.end(),
                   {{"dq.npy", &*call.dq}, {"dk.npy", &*call.dk}, {"dv.npy", &*call.dv}});
    if (call.d_mask_bias) outputs.emplace_back("dmask_bias.npy", &*call.d_mask_bias);
    if (call.d_pair_bias) outputs.emplace_back("dpair_bias.npy", &*call.d_pair_bias);
  }
  write_outputs(out_dir, outputs);

  out << "evoattn run: " << device_name(device) << ", " << util::dtype_name(call.q.view.dtype)
      << ": wrote";
  for (const auto& output : outputs) out << ' ' << output.first;
  out << " to " << out_dir.string() << '\n';
  return 0;
}

}  // namespace evoattn::cli
