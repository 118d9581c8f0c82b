// The decode sweep protocol (decodebench/harness.py), step by step:
// prefill = the prompt fed one token at a time (the model takes one token per call); the last
// prefill step's logits give the first generated token; N - 1 decode steps give the rest.
// TTFT = the summed time of the prefill steps (the last one yields the first token).
// token_latencies_ms[k] is the step that produced token k + 1 (entry 0: the last prefill step);
// decode tok/s is over the pure decode steps. The observer runs between steps, never inside one.
import Foundation

/// One decode step of a loaded model, whatever runtime runs it (CoreMLEngine, CoreAIEngine).
/// `step` is async because Core AI's inference call is; Core ML's synchronous prediction
/// satisfies it as it is.
public protocol StepEngine {
    mutating func reset() throws
    /// Feed `token` at `position`; the greedy next token.
    mutating func step(token: Int, position: Int) async throws -> Int
}

/// What the harness watches around the timed steps (decodebench.harness.SweepObserver).
public protocol SweepObserver: AnyObject {
    /// After every step of a timed prompt: sample memory; throw if the run was interrupted.
    func afterStep() throws
    /// After every prompt (sample its thermal state); the result, as the harness keeps it.
    func afterPrompt(_ result: PromptResult) -> PromptResult
}

public final class Unobserved: SweepObserver {
    public init() {}
    public func afterStep() throws {}
    public func afterPrompt(_ result: PromptResult) -> PromptResult { result }
}

public enum MonotonicClock {
    /// Nanoseconds that never go backwards (mach absolute time, not wall time).
    public static func now() -> UInt64 { clock_gettime_nsec_np(CLOCK_UPTIME_RAW) }
}

/// Why the job cannot run (decodebench.harness.job_problem, the same checks), or nil.
public func jobProblem(_ job: HarnessJob) -> String? {
    if job.protocolVersion != HarnessProtocol.version {
        return "job.json speaks harness protocol \(job.protocolVersion), the harness speaks \(HarnessProtocol.version)"
    }
    if job.contextTokens < 1 || job.decodeTokens < 1 || job.warmupSteps < 0 {
        return "context_tokens and decode_tokens must be at least 1, warmup_steps at least 0"
    }
    if let problem = engineProblem(job) { return problem }
    if job.warmupSteps > job.contextTokens {
        return "warmup_steps \(job.warmupSteps) exceeds the context of \(job.contextTokens) tokens (warm-up step k writes KV position k)"
    }
    if let wait = job.thermalWaitS, !(0...HarnessProtocol.maxThermalWaitS).contains(wait) {
        return "thermal_wait_s \(wait) is outside 0...\(HarnessProtocol.maxThermalWaitS)"
    }
    if job.prompts.isEmpty { return "the job has no prompts" }
    for prompt in job.prompts {
        let steps = prompt.tokenIds.count + job.decodeTokens - 1
        if prompt.tokenIds.isEmpty { return "prompt \(prompt.index) has no tokens" }
        if steps > job.contextTokens {
            return "prompt \(prompt.index): \(prompt.tokenIds.count) prompt tokens + \(job.decodeTokens) decode tokens need \(steps) KV positions, the context holds \(job.contextTokens)"
        }
    }
    return nil
}

public func warmUp<E: StepEngine>(_ engine: inout E, token: Int, steps: Int) async throws {
    for position in 0..<steps {
        _ = try await engine.step(token: token, position: position)
    }
    try engine.reset()
}

public func runPrompt<E: StepEngine>(
    _ engine: inout E, prompt: HarnessPrompt, decodeTokens: Int, observer: SweepObserver = Unobserved()
) async throws -> PromptResult {
    let tokens = prompt.tokenIds
    try engine.reset()
    var prefillNs: UInt64 = 0
    var stepNs: UInt64 = 0
    var next = 0
    for (position, token) in tokens.enumerated() {
        let before = MonotonicClock.now()
        next = try await engine.step(token: token, position: position)
        stepNs = MonotonicClock.now() - before
        prefillNs += stepNs
        try observer.afterStep()
    }
    var latencies: [UInt64] = [stepNs]
    var generated = [next]
    for position in tokens.count..<(tokens.count + decodeTokens - 1) {
        let before = MonotonicClock.now()
        next = try await engine.step(token: next, position: position)
        latencies.append(MonotonicClock.now() - before)
        try observer.afterStep()
        generated.append(next)
    }
    let prefill = max(prefillNs, 1)
    let decodeNs = decodeTokens > 1 ? latencies.dropFirst().reduce(0, +) : latencies[0]
    let result = PromptResult(
        promptIndex: prompt.index,
        promptTokens: tokens.count,
        generatedTokens: decodeTokens,
        ttftMs: Double(prefill) / 1e6,
        prefillTokS: Double(tokens.count) / (Double(prefill) / 1e9),
        decodeTokS: Double(max(decodeTokens - 1, 1)) / (Double(max(decodeNs, 1)) / 1e9),
        tokenLatenciesMs: latencies.map { Double($0) / 1e6 },
        tokenIds: generated
    )
    return observer.afterPrompt(result)
}
