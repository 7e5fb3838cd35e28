/**
 * @file stub.cpp
 * @brief IRBuilder code generation of host stubs and their LLJIT compilation (LLVM 14 to 19).
 */
#include "runtime/stub.hpp"

#include "runtime/launcher.hpp"

#include <fmt/format.h>

#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>

#include <exception>
#include <mutex>
#include <stdexcept>

namespace gdn {

bool stubs_available() { return true; }

namespace {

std::string take(llvm::Error e) { return llvm::toString(std::move(e)); }

/// Emits the body of one stub: every value is an i64, truncated to i32 for 4-byte fields.
class StubEmitter {
 public:
  StubEmitter(llvm::LLVMContext& ctx, llvm::Module& m) : ctx_(ctx), m_(m), b_(ctx) {}

  llvm::Function* emit(const CallPlan& plan, const std::string& symbol) {
    auto* i8p = llvm::Type::getInt8PtrTy(ctx_);
    auto* i64 = b_.getInt64Ty();
    auto* i32 = b_.getInt32Ty();
    auto* i64p = llvm::PointerType::getUnqual(i64);
    // void launch(i8* ctx, i32 program, i32 gx, i32 gy, i32 gz, i8* params, i32 size, i64 stream)
    auto* launch_ty = llvm::FunctionType::get(b_.getVoidTy(), {i8p, i32, i32, i32, i32, i8p, i32, i64}, false);
    auto* runtime_ty = llvm::StructType::get(ctx_, {llvm::PointerType::getUnqual(launch_ty), i8p});
    auto* fn_ty = llvm::FunctionType::get(b_.getVoidTy(), {i64p, llvm::PointerType::getUnqual(runtime_ty)}, false);
    auto* fn = llvm::Function::Create(fn_ty, llvm::Function::ExternalLinkage, symbol, m_);
    auto* frame = fn->getArg(0);
    auto* rt = fn->getArg(1);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn));

    auto word = [&](Frame f) {
      return b_.CreateLoad(i64, b_.CreateConstGEP1_64(i64, frame, static_cast<uint64_t>(f)));
    };
    T_ = word(Frame::T);
    N_ = word(Frame::N);
    NT_ = b_.CreateAdd(b_.CreateSDiv(T_, b_.getInt64(plan.chunk)), N_, "nt");
    R_ = word(Frame::seg_rows);
    auto offsets = [&](const std::vector<ByteFormula>& slots, llvm::Value* base) {
      std::vector<llvm::Value*> out;
      llvm::Value* at = base;
      for (const ByteFormula& f : slots) {
        out.push_back(at);
        llvm::Value* bytes = linear(f.per_token, f.per_doc, f.per_chunk, 0, f.constant);
        llvm::Value* aligned = b_.CreateAnd(b_.CreateAdd(bytes, b_.getInt64(255)), b_.getInt64(~int64_t{255}));
        at = b_.CreateAdd(at, aligned);
      }
      return out;
    };
    const auto saved = offsets(plan.saved_slots, word(Frame::saved));
    const auto ws = offsets(plan.ws_slots, word(Frame::ws));

    auto* launch_fn = b_.CreateLoad(llvm::PointerType::getUnqual(launch_ty), b_.CreateStructGEP(runtime_ty, rt, 0));
    auto* launch_ctx = b_.CreateLoad(i8p, b_.CreateStructGEP(runtime_ty, rt, 1));
    auto* stream = word(Frame::stream);
    auto* buf_ty = llvm::ArrayType::get(b_.getInt8Ty(), kMaxParamsBytes);
    auto* buf = b_.CreateAlloca(buf_ty, nullptr, "params");
    buf->setAlignment(llvm::Align(16));
    auto* buf_i8 = b_.CreateBitCast(buf, i8p);

    for (const PlannedLaunch& l : plan.launches) {
      b_.CreateMemSet(buf_i8, b_.getInt8(0), b_.getInt64(l.params_size), llvm::MaybeAlign(16));
      for (const Field& f : l.fields) {
        llvm::Value* v = nullptr;
        const ValueSource& s = f.source;
        switch (s.kind) {
          case ValueSource::from_frame: v = word(s.frame_word); break;
          case ValueSource::from_slot:
            v = (s.region == RegionKind::saved ? saved : ws)[static_cast<size_t>(s.slot)];
            break;
          case ValueSource::from_formula: v = eval(s.formula); break;
          case ValueSource::from_constant: v = b_.getInt64(static_cast<uint64_t>(s.value)); break;
        }
        auto* at = b_.CreateConstGEP1_64(b_.getInt8Ty(), buf_i8, f.offset);
        llvm::Type* ty = f.size == 4 ? static_cast<llvm::Type*>(i32) : i64;
        if (f.size == 4) v = b_.CreateTrunc(v, i32);
        b_.CreateAlignedStore(v, b_.CreateBitCast(at, llvm::PointerType::getUnqual(ty)), llvm::MaybeAlign(f.size));
      }
      llvm::Value* grid[3];
      for (int d = 0; d < 3; ++d) grid[d] = b_.CreateTrunc(eval(l.grid[static_cast<size_t>(d)]), i32);
      b_.CreateCall(launch_ty, launch_fn,
                    {launch_ctx, b_.getInt32(static_cast<uint32_t>(l.program)), grid[0], grid[1], grid[2], buf_i8,
                     b_.getInt32(l.params_size), stream});
    }
    b_.CreateRetVoid();
    return fn;
  }

 private:
  llvm::Value* linear(int64_t t, int64_t n, int64_t nt, int64_t rows, int64_t c) {
    llvm::Value* v = b_.getInt64(static_cast<uint64_t>(c));
    if (t) v = b_.CreateAdd(v, b_.CreateMul(T_, b_.getInt64(static_cast<uint64_t>(t))));
    if (n) v = b_.CreateAdd(v, b_.CreateMul(N_, b_.getInt64(static_cast<uint64_t>(n))));
    if (nt) v = b_.CreateAdd(v, b_.CreateMul(NT_, b_.getInt64(static_cast<uint64_t>(nt))));
    if (rows) v = b_.CreateAdd(v, b_.CreateMul(R_, b_.getInt64(static_cast<uint64_t>(rows))));
    return v;
  }
  llvm::Value* eval(const Lin& l) {
    llvm::Value* v = linear(l.t, l.n, l.nt, l.rows, l.c + l.div - 1);
    return l.div == 1 ? v : b_.CreateSDiv(v, b_.getInt64(static_cast<uint64_t>(l.div)));
  }

  llvm::LLVMContext& ctx_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;
  llvm::Value* T_ = nullptr;
  llvm::Value* N_ = nullptr;
  llvm::Value* NT_ = nullptr;
  llvm::Value* R_ = nullptr;  ///< Frame::seg_rows
};

std::unique_ptr<llvm::Module> build_module(llvm::LLVMContext& ctx, const CallPlan& plan, const std::string& symbol) {
  auto m = std::make_unique<llvm::Module>(symbol, ctx);
  StubEmitter(ctx, *m).emit(plan, symbol);
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(*m, &os))
    throw std::logic_error(fmt::format("host stub '{}' failed LLVM verification: {}", symbol, os.str()));
  return m;
}

class OrcStubCompiler final : public StubCompiler {
 public:
  explicit OrcStubCompiler(std::unique_ptr<llvm::orc::LLJIT> jit) : jit_(std::move(jit)) {}

  StubFn compile(const CallPlan& plan, const std::string& symbol) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto ctx = std::make_unique<llvm::LLVMContext>();
    auto m = build_module(*ctx, plan, symbol);
    if (auto e = jit_->addIRModule(llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx))))
      throw std::runtime_error(fmt::format("host stub '{}': {}", symbol, take(std::move(e))));
    auto sym = jit_->lookup(symbol);
    if (!sym) throw std::runtime_error(fmt::format("host stub '{}': {}", symbol, take(sym.takeError())));
#if LLVM_VERSION_MAJOR >= 15
    return sym->toPtr<StubFn>();
#else
    return llvm::jitTargetAddressToFunction<StubFn>(sym->getAddress());
#endif
  }

  std::string ir_text(const CallPlan& plan, const std::string& symbol) override {
    llvm::LLVMContext ctx;
    auto m = build_module(ctx, plan, symbol);
    std::string text;
    llvm::raw_string_ostream os(text);
    m->print(os, nullptr);
    return os.str();
  }

 private:
  std::mutex mutex_;
  std::unique_ptr<llvm::orc::LLJIT> jit_;
};

struct TrampolineCtx {
  const LayerIR* ir;
  Launcher* launcher;
  std::exception_ptr error;
};

/// No exception may unwind through the JIT-compiled stub (it has no unwind tables): the first
/// failure is kept, later launches of the call are skipped, and run_stub rethrows it.
void launch_trampoline(void* ctx, int32_t program, uint32_t gx, uint32_t gy, uint32_t gz, const void* params,
                       uint32_t size, uint64_t stream) noexcept {
  auto* t = static_cast<TrampolineCtx*>(ctx);
  if (t->error) return;
  try {
    t->launcher->launch(t->ir->programs[static_cast<size_t>(program)], rt::dim3_t{gx, gy, gz}, params, size,
                        reinterpret_cast<CUstream>(stream));
  } catch (...) {
    t->error = std::current_exception();
  }
}

}  // namespace

std::unique_ptr<StubCompiler> StubCompiler::create() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
  auto jit = llvm::orc::LLJITBuilder().create();
  if (!jit) throw std::runtime_error("cannot start the LLVM JIT for host stubs: " + take(jit.takeError()));
  (*jit)->getExecutionSession().setErrorReporter(
      [](llvm::Error e) { fmt::print(stderr, "gdnc: host stub JIT error: {}\n", take(std::move(e))); });
  return std::make_unique<OrcStubCompiler>(std::move(*jit));
}

void run_stub(StubFn stub, const LayerIR& ir, const CallFrame& frame, Launcher& launcher) {
  TrampolineCtx ctx{&ir, &launcher, nullptr};
  const StubRuntime runtime{&launch_trampoline, &ctx};
  stub(frame.word.data(), &runtime);
  if (ctx.error) std::rethrow_exception(ctx.error);
}

}  // namespace gdn
