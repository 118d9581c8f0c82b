// The decode sweep protocol (decodebench/harness.py), step by step:
// prefill = the prompt fed one token at a time (the model takes one token per call); the last
// prefill step's logits give the first generated token; N - 1 decode steps give the rest.
// token_latencies_ms[k] is the step that produced token k + 1 (entry 0: the last prefill step);
// decode tok/s is over the pure decode steps.
import Foundation

public protocol StepEngine {
    mutating func reset() throws
    /// Feed `token` at `position`; the greedy next token.
    mutating func step(token: Int, position: Int) throws -> Int
}

public enum MonotonicClock {
    /// Nanoseconds that never go backwards (mach absolute time, not wall time).
    public static func now() -> UInt64 { clock_gettime_nsec_np(CLOCK_UPTIME_RAW) }
}

public func warmUp<E: StepEngine>(_ engine: inout E, token: Int, steps: Int) throws {
    for position in 0..<steps {
        _ = try engine.step(token: token, position: position)
    }
    try engine.reset()
}

public func runPrompt<E: StepEngine>(_ engine: inout E, prompt: HarnessPrompt, decodeTokens: Int) throws -> PromptResult {
    let tokens = prompt.tokenIds
    try engine.reset()
    let started = MonotonicClock.now()
    var stepStarted = started
    var next = 0
    for (position, token) in tokens.enumerated() {
        stepStarted = MonotonicClock.now()
        next = try engine.step(token: token, position: position)
    }
    let prefillDone = MonotonicClock.now()
    var latencies: [UInt64] = [prefillDone - stepStarted]
    var generated = [next]
    for position in tokens.count..<(tokens.count + decodeTokens - 1) {
        let before = MonotonicClock.now()
        next = try engine.step(token: next, position: position)
        latencies.append(MonotonicClock.now() - before)
        generated.append(next)
    }
    let prefillNs = max(prefillDone - started, 1)
    let decodeNs = decodeTokens > 1 ? latencies.dropFirst().reduce(0, +) : latencies[0]
    return PromptResult(
        promptIndex: prompt.index,
        promptTokens: tokens.count,
        generatedTokens: decodeTokens,
        ttftMs: Double(prefillNs) / 1e6,
        prefillTokS: Double(tokens.count) / (Double(prefillNs) / 1e9),
        decodeTokS: Double(max(decodeTokens - 1, 1)) / (Double(max(decodeNs, 1)) / 1e9),
        tokenLatenciesMs: latencies.map { Double($0) / 1e6 },
        tokenIds: generated
    )
}
