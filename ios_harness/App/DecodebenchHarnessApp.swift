// The app: once in the foreground, run the job in Documents (file sharing is on, so the agent
// pushes it over house_arrest), keep the screen awake while measuring, then show what happened.
// Leaving the foreground mid-run (lock, app switch, a call, Control Center) interrupts the run:
// the sweep notices between steps and writes ok: false with reason "interrupted", finishing that
// write in a background task so the marker is there before the app is suspended.
import HarnessKit
import SwiftUI
import UIKit

@main
struct DecodebenchHarnessApp: App {
    @Environment(\.scenePhase) private var scenePhase
    @State private var status = "waiting for a job"
    @State private var started = false
    private let interruption = Interruption()

    var body: some Scene {
        WindowGroup {
            Text(status).font(.system(.body, design: .monospaced)).padding()
                .onReceive(NotificationCenter.default.publisher(for: UIApplication.willResignActiveNotification)) { _ in
                    if started { interruption.interrupt("the app resigned active (locked, switched away or covered)") }
                }
        }
        .onChange(of: scenePhase, initial: true) { _, phase in
            if phase == .active, !started {
                started = true
                Task { await runJob() }
            } else if phase != .active, started {
                interruption.interrupt("the scene went \(phase == .background ? "to the background" : "inactive")")
            }
        }
    }

    @MainActor
    private func runJob() async {
        let documents = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        let arguments = CommandLine.arguments
        let jobFile = arguments.firstIndex(of: "--job").flatMap { index in
            index + 1 < arguments.count ? arguments[index + 1] : nil
        } ?? HarnessFiles.job
        UIApplication.shared.isIdleTimerDisabled = true  // no auto-lock mid-measurement
        let background = BackgroundTime()
        background.begin()
        status = "running \(jobFile)"
        let harness = Harness(documents: documents, interruption: interruption)
        await Task.detached(priority: .userInitiated) { await harness.run(jobFile: jobFile) }.value
        UIApplication.shared.isIdleTimerDisabled = false
        background.end()
        status = interruption.reason.map { "interrupted: \($0)" } ?? "finished \(jobFile)"
    }
}

/// Time to write the done marker if the app is sent to the background mid-run.
@MainActor
final class BackgroundTime {
    private var identifier = UIBackgroundTaskIdentifier.invalid

    func begin() {
        identifier = UIApplication.shared.beginBackgroundTask(withName: "decodebench run") { [self] in
            MainActor.assumeIsolated { end() }
        }
    }

    func end() {
        guard identifier != .invalid else { return }
        UIApplication.shared.endBackgroundTask(identifier)
        identifier = .invalid
    }
}
